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


@pytest.mark.parametrize("rows", [1, 2, 3, 6, 7, 8, 9, 16])
def test_packed_linear_equals_matmul(ext, rows):
    """The panel kernel on pack_panels(w): x @ w.T within 1e-5 relative, for every shape (odd N pads
    the last panel), 1 or 2 threads, and both builds (AVX2 forced in a child process below)."""
    mx.random.seed(100 + rows)
    for n, k in SHAPES:
        x, w = mx.random.normal((1, rows, k)), mx.random.normal((n, k))
        wp = native.pack_panels(w)
        assert wp.shape == ((n + 15) // 16, k, 16)
        want = x @ w.T
        for threads in (1, 2):
            got = ext.packed_linear(x, wp, n, threads)
            assert got.shape == want.shape and got.dtype == mx.float32
            assert _rel_err(got, want) < 1e-5, (rows, n, k, threads)


def test_packed_rows_do_not_depend_on_the_row_count(ext):
    """Each output is one sum over k in the same order whatever the rows beside it: a row verified
    with 7 others is bit-identical to the same row decoded alone (BLAS products need not be)."""
    mx.random.seed(3)
    w = mx.random.normal((1536, 576))
    wp = native.pack_panels(w)
    x = mx.random.normal((1, 9, 576))
    together = ext.packed_linear(x, wp, 1536)
    for r in range(9):
        alone = ext.packed_linear(x[:, r : r + 1], wp, 1536)
        assert mx.array_equal(alone[0, 0], together[0, r]).item(), r


def test_packed_avx2_build(ext):
    """The AVX2 build of the panel kernel (chosen on CPUs without AVX-512) against mx.matmul."""
    code = ("import engine, mlx.core as mx, engine.native as n; e = n.load(); print(e.instruction_set()); "
            "mx.random.seed(1); w = mx.random.normal((129, 33)); wp = n.pack_panels(w)\n"
            "for r in (1, 3, 4, 7, 16):\n"
            "    x = mx.random.normal((1, r, 33)); d = mx.max(mx.abs(e.packed_linear(x, wp, 129) - x @ w.T))\n"
            "    assert d.item() < 1e-4, (r, d.item())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, DSPARK_NATIVE_ISA="avx2"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "avx2"


def test_bad_inputs_are_refused(ext):
    """float16 or a mismatched inner size raise instead of computing something wrong."""
    with pytest.raises(ValueError):
        ext.skinny_linear(mx.zeros((1, 8), dtype=mx.float16), mx.zeros((4, 8), dtype=mx.float16))
    with pytest.raises(ValueError):
        ext.skinny_linear(mx.zeros((1, 8)), mx.zeros((4, 9)))
    with pytest.raises(ValueError):  # more outputs than the panels hold
        ext.packed_linear(mx.zeros((1, 8)), native.pack_panels(mx.zeros((4, 8))), 17)
    with pytest.raises(ValueError):  # not a packed weight
        ext.packed_linear(mx.zeros((1, 8)), mx.zeros((4, 8)), 4)


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
