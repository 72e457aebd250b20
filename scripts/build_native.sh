#!/usr/bin/env bash
# Build engine/native's MLX extension (docs/native.md) against this virtualenv's MLX wheel and copy
# it into engine/native/. Needs CMake, a C++20 compiler, OpenMP and nanobind at the ABI of the MLX
# wheel (the test extra pins it). scripts/bootstrap.sh runs it where it can (the engine uses the
# kernel with DSPARK_NATIVE=1).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(cd "${DSPARK_VENV:-.venv}" && pwd)
BUILD=${DSPARK_NATIVE_BUILD:-build/native}
cmake -S engine/native -B "$BUILD" -DPython_EXECUTABLE="$VENV/bin/python" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "${DSPARK_NATIVE_JOBS:-2}" >/dev/null
# A new file moved into place, not the old one overwritten: a running server or trainer keeps the
# library it mapped.
for lib in "$BUILD"/_native*.so; do
  cp "$lib" "engine/native/.$(basename "$lib").tmp"
  mv -f "engine/native/.$(basename "$lib").tmp" "engine/native/$(basename "$lib")"
done
echo "built $(ls engine/native/_native*.so)"
