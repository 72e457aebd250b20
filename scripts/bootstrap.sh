#!/usr/bin/env bash
# Set up everything dspark-serve needs, idempotently: the fast BLAS (Linux), a virtualenv with the
# project installed, and the embedded default model. `make serve`, `make test`, the Dockerfile and
# CI all run this one script, so their setup cannot drift apart.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${DSPARK_VENV:-.venv}
PYTHON=${PYTHON:-python3}

say() { echo "[bootstrap] $*" >&2; }

have_blas() { ls /usr/lib/*/blis-pthread/libblis.so.4 /usr/lib/*/libblis.so.4 >/dev/null 2>&1; }

install_blas() {
  [ "$(uname -s)" = Linux ] || return 0   # macOS: MLX uses Metal/Accelerate
  have_blas && return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    say "warning: no apt-get; install BLIS or OpenBLAS yourself for fast MLX on the CPU (see dspark doctor)"
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
      say "warning: not root; run 'sudo apt-get install libblis4-pthread' for fast MLX on the CPU"
      return 0
    fi
  fi
  say "installing the BLIS BLAS (libblis4-pthread)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libblis4-pthread >/dev/null
}

make_venv() {
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 10), "dspark-serve needs Python >= 3.10"'
  [ -x "$VENV/bin/python" ] || { say "creating virtualenv $VENV"; "$PYTHON" -m venv "$VENV"; }
  # Reinstall only when the project metadata changed (editable install picks up code changes).
  local stamp="$VENV/.dspark-installed" want
  want=$(cat pyproject.toml | "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing dspark-serve and its dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]"
    echo "$want" > "$stamp"
  fi
}

install_blas
make_venv
say "preparing the default model (once; cached in ${DSPARK_CACHE:-~/.cache/dspark-serve})"
"$VENV/bin/dspark" prepare >/dev/null
