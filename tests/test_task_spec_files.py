"""A task spec file that is not a mapping is refused naming the file and what it holds."""

import pytest

from relaxtune.tasks.spec import load_task


@pytest.mark.parametrize(
    "text, got",
    [("", "an empty file"), ("# only a comment\n", "an empty file"), ("- a\n- b\n", "list"), ("42\n", "int")],
)
def test_a_spec_that_is_not_a_mapping_says_what_it_holds(tmp_path, text, got):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as refused:
        load_task(str(path))
    first = str(refused.value).splitlines()[0]
    assert first == f"invalid task spec {path}: it must hold a mapping of fields, got {got}"
