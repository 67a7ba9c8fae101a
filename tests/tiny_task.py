"""A tiny local math task over the tiny tokenizer (written as YAML for the CLI and flows)."""

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def write_tiny_task(directory: Path, max_new_tokens: int = 10, name: str = "tiny_math") -> str:
    """Write ``<name>.yaml`` into ``directory`` and return its path."""
    path = Path(directory) / f"{name}.yaml"
    path.write_text(f"""
name: {name}
version: 1
dataset: {{path: json, data_files: {FIXTURES / "tiny_math.jsonl"}}}
fields: {{question: question, answer: answer}}
prompt: {{template: "{{question}} = ?"}}
grader: {{kind: math}}
sampling: {{temperature: 0.8, top_p: 1.0, top_k: null}}
max_new_tokens: {max_new_tokens}
""")
    return str(path)
