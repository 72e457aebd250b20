"""engine/native (docs/native.md): the skinny-GEMM MLX extension, built here with CMake, against
mx.matmul over row counts 1-16, model and odd shapes, strided inputs and thread counts; and the
clean fallback when it is not built."""

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

import engine.native as native

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (37, 19), (8, 8), (129, 33)]  # (N, K)


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    """The extension, built once for this module (CMake, a C++ compiler and nanobind are needed)."""
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.skip("no cmake or C++ compiler on this machine")
    env = dict(os.environ, DSPARK_VENV=str(Path(sys.executable).parents[1]),
               DSPARK_NATIVE_BUILD=str(tmp_path_factory.mktemp("native-build")), DSPARK_NATIVE_JOBS="1")
    subprocess.run([str(ROOT / "scripts" / "build_native.sh")], check=True, env=env, cwd=ROOT)
    module = native.load()
    assert module is not None, native.REASON
    return module


def _rel_err(a: mx.array, b: mx.array) -> float:
    return float(mx.max(mx.abs(a - b)).item() / max(float(mx.max(mx.abs(b)).item()), 1e-30))


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 16])
def test_skinny_linear_equals_matmul(ext, rows):
    """x [1, rows, K] @ w.T within 1e-5 relative of MLX's matmul, for every shape and 1 or 2 threads."""
    mx.random.seed(rows)
    for n, k in SHAPES:
        x, w = mx.random.normal((1, rows, k)), mx.random.normal((n, k))
        want = x @ w.T
        for threads in (1, 2):
            got = ext.skinny_linear(x, w, threads)
            assert got.shape == want.shape and got.dtype == mx.float32
            assert _rel_err(got, want) < 1e-5, (rows, n, k, threads)


def test_strided_inputs_and_leading_dimensions(ext):
    """A transposed (non-contiguous) x is made contiguous first; weight rows with a row stride
    (a slice of a larger matrix) are read in place; any leading shape is kept."""
    mx.random.seed(0)
    x = mx.random.normal((64, 3)).T  # [3, 64], column-major
    big = mx.random.normal((40, 80))
    w = big[:, :64]  # [40, 64], row stride 80
    assert _rel_err(ext.skinny_linear(x, w), x @ w.T) < 1e-5
    x4 = mx.random.normal((2, 3, 4, 64))
    assert ext.skinny_linear(x4, w).shape == (2, 3, 4, 40)


def test_bad_inputs_are_refused(ext):
    """float16 or a mismatched inner size raise instead of computing something wrong."""
    with pytest.raises(ValueError):
        ext.skinny_linear(mx.zeros((1, 8), dtype=mx.float16), mx.zeros((4, 8), dtype=mx.float16))
    with pytest.raises(ValueError):
        ext.skinny_linear(mx.zeros((1, 8)), mx.zeros((4, 9)))


def test_fallback_when_not_built(monkeypatch):
    """Without the built module, load() returns None and says why in one line."""
    real_import = importlib.import_module

    def missing(name, *args):
        if name == "engine.native._native":
            raise ImportError("no module named _native")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", missing)
    assert native.load() is None
    assert "not built" in native.REASON and "build_native.sh" in native.REASON
