"""The tree passes `ruff check` with the rules selected in pyproject.toml ([tool.ruff.lint])."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    # ruff ships as a binary in the test extra; run it through the interpreter's environment.
    ruff = Path(sys.executable).with_name("ruff")
    result = subprocess.run([str(ruff), "check", "--output-format", "concise", str(ROOT)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
