"""The README's Python examples run as written, and its two set-up commands are the ones CI uses."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README.md has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.compile(r"python -m pytest[^\n`&]*")
    assert command.findall(README)[0].strip() == command.findall(ci)[-1].strip() == "python -m pytest -n auto"
    assert "pip install torch==2.13.0" in README and "pip install -q torch==2.13.0" in ci
