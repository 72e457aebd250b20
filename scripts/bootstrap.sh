#!/usr/bin/env bash
# Set up everything dspark-serve needs, idempotently: the fast BLAS (Linux), a virtualenv with the
# project installed, the embedded default model, and (for the tests) the Node.js client's packages and
# the Chromium that drives the chat page.
# `make serve`, `make test`, the Dockerfile and CI all run this one script, so their setup cannot
# drift apart. DSPARK_EXTRAS picks the pip extras (default `test`; the Docker image sets it empty).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${DSPARK_VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${DSPARK_EXTRAS-test}

say() { echo "[bootstrap] $*" >&2; }

# apt_install WHY PKG...: install Debian packages as root or with passwordless sudo; else warn.
apt_install() {
  local why=$1; shift
  if ! command -v apt-get >/dev/null 2>&1; then
    say "warning: no apt-get; install $* yourself ($why)"
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
      say "warning: not root; run 'sudo apt-get install $*' ($why)"
      return 0
    fi
  fi
  say "installing $* ($why)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

have_blas() { ls /usr/lib/*/blis-pthread/libblis.so.4 /usr/lib/*/libblis.so.4 >/dev/null 2>&1; }

install_blas() {
  [ "$(uname -s)" = Linux ] || return 0   # macOS: MLX uses Metal/Accelerate
  have_blas || apt_install "fast MLX on the CPU, see dspark doctor" libblis4-pthread
}

make_venv() {
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 10), "dspark-serve needs Python >= 3.10"'
  [ -x "$VENV/bin/python" ] || { say "creating virtualenv $VENV"; "$PYTHON" -m venv "$VENV"; }
  # Reinstall only when the project metadata or the extras changed (editable install picks up code).
  local stamp="$VENV/.dspark-installed" want target=.
  [ -z "$EXTRAS" ] || target=".[$EXTRAS]"
  want=$( (cat pyproject.toml; echo "$target") | "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing dspark-serve${EXTRAS:+ with [$EXTRAS]} and its dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$target"
    echo "$want" > "$stamp"
  fi
}

# The Node.js client example is tested against a live server, so the tests need node, npm and its
# locked packages. Installed only with the test extras (not in the Docker image).
install_node_client() {
  case ",$EXTRAS," in *,test,*) ;; *) return 0 ;; esac
  if ! command -v npm >/dev/null 2>&1; then
    apt_install "the Node.js client example's test" nodejs npm
  fi
  command -v npm >/dev/null 2>&1 || { say "warning: no npm; the Node.js client test will fail"; return 0; }
  local dir=clients/node stamp=clients/node/node_modules/.dspark-lock want
  want=$("$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' \
    "$dir/package-lock.json")
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing the Node.js client's packages (npm ci in $dir)"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$want" > "$stamp"
  fi
}

# The chat page's tests drive a headless Chromium through Selenium (tests/server/test_page_browser.py).
# Debian's chromium and chromium-driver: browser downloads at test time are not needed (nor reachable
# in CI). Installed only with the test extras (not in the Docker image).
install_browser() {
  case ",$EXTRAS," in *,test,*) ;; *) return 0 ;; esac
  [ "$(uname -s)" = Linux ] || return 0   # elsewhere: install Chromium and its driver yourself
  if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    apt_install "the chat page's browser tests" chromium chromium-driver
  fi
}

# The native panel kernel (engine/native, docs/native.md; used with DSPARK_NATIVE=1): built when
# this is Linux x86-64 with CMake and a C++ compiler, and rebuilt only when its sources or MLX change.
# A failed or skipped build is not an error: the engine keeps MLX's path and says why.
build_native() {
  [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ] || return 0
  if ! command -v cmake >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then
    say "note: no cmake or C++ compiler; the native kernel is not built (optional, docs/native.md)"
    return 0
  fi
  if "$VENV/bin/python" -c 'import sys; from engine.native import build_is_current; sys.exit(not build_is_current())'; then
    return 0
  fi
  say "building the native kernel (optional, docs/native.md)"
  if ! { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "nanobind==3.1.0" &&
         DSPARK_VENV="$VENV" ./scripts/build_native.sh >/dev/null 2>&1 &&
         "$VENV/bin/python" -c 'from engine.native import write_stamp; write_stamp()'; }; then
    say "warning: the native kernel did not build (optional; scripts/build_native.sh shows why)"
  fi
}

install_blas
make_venv
install_node_client
install_browser
build_native
say "preparing the default model (once; cached in ${DSPARK_CACHE:-~/.cache/dspark-serve})"
"$VENV/bin/dspark" prepare >/dev/null  # the precision `dspark serve` loads here (--precision auto)
