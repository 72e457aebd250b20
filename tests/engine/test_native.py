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
import mlx.nn as nn
import pytest

import engine.native as native

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (37, 19), (8, 8), (129, 33)]  # (N, K)


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    """The extension: the one in place when the test command's bootstrap built it from these sources
    for this MLX, else built here once for this module (CMake, a C++ compiler and nanobind are needed)."""
    if native.build_is_current():
        module = native.load()
        assert module is not None, native.REASON
        return module
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


@pytest.fixture(scope="module")
def routed_smollm2(ext, default_model_dir):
    """A fresh copy of the default model (not the session's shared one) with its linears routed."""
    from engine.loading.target import load_target
    from engine.native.linear import PackedLinear, route_linears

    model, tok, _ = load_target(str(default_model_dir))
    count = route_linears(model, ext)
    assert count == 30 * 7 + 1  # every projection of the 30 layers and the tied head
    assert not any(isinstance(m, nn.Linear) for _, m in model.named_modules())
    assert sum(isinstance(m, PackedLinear) for _, m in model.named_modules()) == 30 * 7
    return model, tok


def test_routed_target_speculates_exactly_its_own_greedy(routed_smollm2, default_target, default_model_dir):
    """With every product through the panel kernel, speculative greedy equals the routed model's own
    plain greedy token for token (verify rows are bit-identical to decode rows, so no tie slack), and
    the routed model's greedy equals mlx-lm's on MLX's path up to measured near-ties."""
    from engine.api import SpecStats
    from engine.models.target import Target
    from engine.sampling import SamplerSettings
    from engine.samplers import make_sampler
    from engine.scheduler import Scheduler
    from engine.spec import DecodeOptions, SpecDecoder
    from engine.text import apply_chat_template
    from tests.engine import tiny
    from tests.engine.references import cached_plain_greedy, plain_greedy
    from tests.engine.smollm2_cases import QUESTIONS

    model, tok = routed_smollm2
    mlx_model = default_target[0]
    target = Target(model, (2, 14, 26))
    for i, question in enumerate(QUESTIONS[:2]):
        prompt = apply_chat_template(tok, [{"role": "user", "content": question}])
        own = plain_greedy(model, prompt, 40)
        drafter = tiny.OracleDrafter(target, reference=prompt + own, corrupt_every=(3, 4)[i], vocab=49152)
        opts = DecodeOptions(make_sampler(SamplerSettings(), "rejection", 0), stop_ids=frozenset())
        dec = SpecDecoder(target, drafter, Scheduler(4), opts, SpecStats(mode="dspark", cap=4))
        drafter.committed = dec.committed_view()
        out = dec.prefill(prompt)
        while len(out) < len(own):
            out += dec.step(len(own) - len(out))
        assert out[: len(own)] == own, i
        assert 0 < dec.stats.accepted_tokens < dec.stats.drafted_tokens
        reference = cached_plain_greedy(default_model_dir, mlx_model, prompt, 128)[: len(own)]
        k = next((j for j, (a, b) in enumerate(zip(reference, own)) if a != b), None)
        if k is not None:  # only where MLX's own top two logits nearly tie
            top = mx.sort(mlx_model(mx.array([prompt + reference[:k]]))[0, -1])[-2:].tolist()
            assert top[1] - top[0] <= 1e-4, (i, k, top)


def test_native_is_opt_in_and_falls_back_with_a_line(ext, default_model_dir, monkeypatch, caplog):
    """DSPARK_NATIVE=1 routes the loaded target; unset, nothing changes; asked for without the built
    extension, MLX's path stays and one warning says why."""
    import logging

    import engine.native.linear as linear
    from engine.loading.target import load_target

    def packed_count(model):
        return sum(isinstance(m, linear.PackedLinear) for _, m in model.named_modules())

    monkeypatch.delenv("DSPARK_NATIVE", raising=False)
    assert packed_count(load_target(str(default_model_dir))[0]) == 0
    monkeypatch.setenv("DSPARK_NATIVE", "1")
    assert packed_count(load_target(str(default_model_dir))[0]) == 210
    monkeypatch.setattr(native, "load", lambda: None)
    monkeypatch.setattr(native, "REASON", "the native extension is not built (scripts/build_native.sh)")
    with caplog.at_level(logging.WARNING, logger="engine.loading.target"):
        assert packed_count(load_target(str(default_model_dir))[0]) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "DSPARK_NATIVE: keeping MLX's path: the native extension is not built (scripts/build_native.sh)"]


def test_doctor_reports_the_linear_path(ext):
    """`dspark doctor` says which path the target's linears take, and that the kernel is opt-in."""
    import json

    def report(extra):
        out = subprocess.run([sys.executable, "-m", "dspark_cli.main", "doctor", "--json"], capture_output=True,
                             text=True, check=True, cwd=ROOT, env={**os.environ, **extra})
        return json.loads(out.stdout)["native"]

    isa = ext.instruction_set()
    assert report({"DSPARK_NATIVE": "0"}) == f"MLX's (the native kernel is opt-in: DSPARK_NATIVE=1; built ({isa}))"
    assert report({"DSPARK_NATIVE": "1"}) == f"native panel kernel ({isa}), DSPARK_NATIVE=1"
