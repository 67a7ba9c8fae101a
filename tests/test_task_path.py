"""The task search path: ``$RELAXTUNE_EVALS``'s folders first, then the task specs packaged in ``relaxtune/evals/``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relaxtune.tasks.spec import PACKAGED_EVALS, evals_dirs, list_tasks, load_task, task_files

SHIPPED = {"aime24", "aime25", "gpqa_diamond", "gsm8k", "gsm8k_mini", "humaneval", "lcb_lite_v6", "math500"}


def _spec(folder: Path, name: str, version: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nversion: {version}\ndataset: {{path: json, data_files: x.jsonl}}\ngrader: {{kind: math}}\n"
    )
    return path


def test_the_packaged_tasks_sit_inside_the_package_and_all_load(monkeypatch, tmp_path):
    monkeypatch.delenv("RELAXTUNE_EVALS", raising=False)
    monkeypatch.chdir(tmp_path)
    import relaxtune

    assert PACKAGED_EVALS == Path(relaxtune.__file__).parent / "evals" and evals_dirs() == [PACKAGED_EVALS]
    assert set(list_tasks()) == SHIPPED
    for name in SHIPPED:
        spec = load_task(name)
        assert spec.name == name and Path(spec.source_file).parent == PACKAGED_EVALS


def test_user_folders_come_first_in_their_order_then_the_packaged_tasks(monkeypatch, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    mine = _spec(first, "gsm8k", 7)  # shadows the packaged gsm8k
    _spec(second, "gsm8k", 8)  # shadowed by the first folder's
    other = _spec(second, "my_task", 1)
    monkeypatch.setenv("RELAXTUNE_EVALS", os.pathsep.join([str(first), "", str(second), str(tmp_path / "absent")]))
    assert evals_dirs() == [first, second, tmp_path / "absent", PACKAGED_EVALS]
    assert set(list_tasks()) == SHIPPED | {"my_task"}
    files = task_files()
    assert files["gsm8k"] == mine and files["my_task"] == other and files["math500"] == PACKAGED_EVALS / "math500.yaml"
    assert load_task("gsm8k").version == 7 and load_task("math500").source_file == str(PACKAGED_EVALS / "math500.yaml")


def test_an_evals_folder_in_the_working_directory_shadows_nothing_unless_on_the_path(monkeypatch, tmp_path):
    monkeypatch.delenv("RELAXTUNE_EVALS", raising=False)
    monkeypatch.chdir(tmp_path)
    local = _spec(tmp_path / "evals", "gsm8k_mini", 99)
    assert load_task("gsm8k_mini").source_file == str(PACKAGED_EVALS / "gsm8k_mini.yaml")
    assert "gsm8k_mini" in list_tasks() and len(list_tasks()) == len(SHIPPED)
    monkeypatch.setenv("RELAXTUNE_EVALS", "evals")
    assert load_task("gsm8k_mini").version == 99 and task_files()["gsm8k_mini"] == Path("evals") / local.name


def test_an_unknown_name_lists_the_tasks_of_every_folder(monkeypatch, tmp_path):
    _spec(tmp_path, "zz_mine", 1)
    monkeypatch.setenv("RELAXTUNE_EVALS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"no task 'nope'; known tasks: aime24, .*, math500, zz_mine$"):
        load_task("nope")


def test_an_unknown_name_names_the_evals_folders_that_do_not_exist(monkeypatch, tmp_path):
    """A typo in $RELAXTUNE_EVALS left its tasks unknown with no word of why (a fresh-venv trial)."""
    _spec(tmp_path / "mine", "zz_mine", 1)
    monkeypatch.setenv("RELAXTUNE_EVALS", os.pathsep.join([str(tmp_path / "mnie"), str(tmp_path / "mine")]))
    with pytest.raises(FileNotFoundError) as err:
        load_task("zz_other")
    assert str(err.value).endswith(f", zz_mine ($RELAXTUNE_EVALS names {tmp_path / 'mnie'}: no such folder)")
