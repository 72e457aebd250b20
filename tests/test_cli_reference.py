"""README.md's flag reference is the argparse parser's, for every subcommand (scripts/cli_reference.py)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _readme_block(gen) -> str:
    text = (ROOT / "README.md").read_text()
    return text.split(gen.BEGIN, 1)[1].split(gen.END, 1)[0]


def test_readme_matches_the_parser():
    """The generated block in README.md equals what the parser renders now."""
    gen = _generator()
    assert _readme_block(gen).strip() == gen.render(gen.build_parser()).strip(), \
        "README.md's CLI reference is stale: run `python scripts/cli_reference.py`"


def test_every_subcommand_and_flag_is_in_the_readme():
    """Each subcommand of `dspark` and each of its option strings appears in the README block."""
    gen = _generator()
    block = _readme_block(gen)
    subcommands = gen._subcommands(gen.build_parser())
    assert {"serve", "generate", "train-drafter"} <= {name for name, _, _ in subcommands}
    for name, _, sub in subcommands:
        assert f"#### `dspark {name}`" in block, name
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in ("-h", "--help") or f"`{flag}`" in block, (name, flag)


def test_new_subcommands_are_discovered():
    """A subcommand the generator was never told about is rendered with its flags and choices."""
    gen = _generator()
    parser = gen.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    extra = sub.add_parser("zz-new", help="a command added later")
    extra.add_argument("--level", choices=["low", "high"], default="low", help="how much")
    rendered = gen.render(parser)
    assert "#### `dspark zz-new`\n\na command added later" in rendered
    assert "| `--level` | `low\\|high` | `low` | how much |" in rendered
    assert gen.splice(f"a\n{gen.BEGIN}\nold\n{gen.END}\nb", rendered) != (ROOT / "README.md").read_text()


def test_defaults_ignore_the_environment(monkeypatch):
    """Env-derived defaults render as the built-in ones, so the README does not depend on who ran it."""
    gen = _generator()
    monkeypatch.setenv("DSPARK_MODE", "baseline")
    monkeypatch.setenv("DSPARK_MAX_DRAFT", "3")
    rendered = gen.render(gen.build_parser())
    assert "| `--mode` | `dspark\\|dflash\\|lookup\\|hybrid\\|auto\\|baseline` | `dspark` |" in rendered
    assert "| `--max-draft` | `MAX_DRAFT` | `auto` |" in rendered


def test_check_mode_passes_on_the_committed_readme():
    """`scripts/cli_reference.py --check` exits 0 when README.md is current."""
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
