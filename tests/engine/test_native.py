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


def run_under_avx2(code: str) -> None:
    """Run `code` (which prints the instruction set, then asserts) in a child forced onto the AVX2 build."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, DSPARK_NATIVE_ISA="avx2"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "avx2"


def test_packed_avx2_build(ext):
    """The AVX2 build of the panel kernel (chosen on CPUs without AVX-512) against mx.matmul."""
    code = ("import engine, mlx.core as mx, engine.native as n; e = n.load(); print(e.instruction_set()); "
            "mx.random.seed(1); w = mx.random.normal((129, 33)); wp = n.pack_panels(w)\n"
            "for r in (1, 3, 4, 7, 16):\n"
            "    x = mx.random.normal((1, r, 33)); d = mx.max(mx.abs(e.packed_linear(x, wp, 129) - x @ w.T))\n"
            "    assert d.item() < 1e-4, (r, d.item())\n")
    run_under_avx2(code)


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
def routed_smollm2(ext, float32_model_dir):
    """A fresh copy of the default model in float32 with its linears routed."""
    from engine.loading.target import load_target
    from engine.native.linear import PackedLinear, route_linears

    model, tok, _ = load_target(str(float32_model_dir))
    count = route_linears(model, ext)
    assert count == 30 * 7 + 1  # every projection of the 30 layers and the tied head
    assert not any(isinstance(m, nn.Linear) for _, m in model.named_modules())
    assert sum(isinstance(m, PackedLinear) for _, m in model.named_modules()) == 30 * 7
    return model, tok


@pytest.fixture(scope="module")
def float32_smollm2(float32_model_dir):
    """The default model in float32 on MLX's own path (DSPARK_NATIVE unset routes no float32 product)."""
    from engine.loading.target import load_target

    os.environ.pop("DSPARK_NATIVE", None)
    return load_target(str(float32_model_dir))[0]


def test_routed_target_speculates_exactly_its_own_greedy(routed_smollm2, float32_smollm2, float32_model_dir):
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
    from tests.engine.references import cached_plain_greedy
    from tests.engine.smollm2_cases import QUESTIONS

    model, tok = routed_smollm2
    mlx_model = float32_smollm2
    target = Target(model, (2, 14, 26))
    for i, question in enumerate(QUESTIONS[:2]):
        prompt = apply_chat_template(tok, [{"role": "user", "content": question}])
        own = cached_plain_greedy(float32_model_dir, model, prompt, 40)  # keyed by the routed products
        drafter = tiny.OracleDrafter(target, reference=prompt + own, corrupt_every=(3, 4)[i], vocab=49152)
        opts = DecodeOptions(make_sampler(SamplerSettings(), "rejection", 0), stop_ids=frozenset())
        dec = SpecDecoder(target, drafter, Scheduler(4), opts, SpecStats(mode="dspark", cap=4))
        drafter.committed = dec.committed_view()
        out = dec.prefill(prompt)
        while len(out) < len(own):
            out += dec.step(len(own) - len(out))
        assert out[: len(own)] == own, i
        assert 0 < dec.stats.accepted_tokens < dec.stats.drafted_tokens
        reference = cached_plain_greedy(float32_model_dir, mlx_model, prompt, 128)[: len(own)]
        k = next((j for j, (a, b) in enumerate(zip(reference, own)) if a != b), None)
        if k is not None:  # only where MLX's own top two logits nearly tie
            top = mx.sort(mlx_model(mx.array([prompt + reference[:k]]))[0, -1])[-2:].tolist()
            assert top[1] - top[0] <= 1e-4, (i, k, top)


def test_native_is_opt_in_for_float32_and_falls_back_with_a_line(ext, float32_model_dir, monkeypatch, caplog):
    """For a float32 target: DSPARK_NATIVE=1 routes the loaded target; unset, nothing changes; asked
    for without the built extension, MLX's path stays and one warning says why."""
    import logging

    import engine.native.linear as linear
    from engine.loading.target import load_target

    def packed_count(model):
        return sum(isinstance(m, linear.PackedLinear) for _, m in model.named_modules())

    monkeypatch.delenv("DSPARK_NATIVE", raising=False)
    assert packed_count(load_target(str(float32_model_dir))[0]) == 0
    monkeypatch.setenv("DSPARK_NATIVE", "1")
    assert packed_count(load_target(str(float32_model_dir))[0]) == 210
    monkeypatch.setattr(native, "load", lambda: None)
    monkeypatch.setattr(native, "REASON", "the native extension is not built (scripts/build_native.sh)")
    with caplog.at_level(logging.WARNING, logger="engine.loading.target"):
        assert packed_count(load_target(str(float32_model_dir))[0]) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "native kernel: keeping MLX's path: the native extension is not built (scripts/build_native.sh)"]


def test_doctor_reports_the_linear_path(ext):
    """`dspark doctor` says which path the target's linears take (by default MLX's for float32
    products and the kernel for quantized ones), which precision the default model gets, and the
    weight memory it then holds (issue 25: at most 130 MB at stored precision)."""
    import json

    megabytes = {}

    def report(extra):
        out = subprocess.run([sys.executable, "-m", "dspark_cli.main", "doctor", "--json"], capture_output=True,
                             text=True, check=True, cwd=ROOT, env={**os.environ, **extra})
        info = json.loads(out.stdout)
        precision = info["precision"].split(" (")[0]
        assert f"of weights at {precision} precision" in info["memory"], info["memory"]
        megabytes[precision] = float(info["memory"].split(" MB")[0])
        return info["native"], precision

    isa = ext.instruction_set()
    assert report({"DSPARK_NATIVE": "0"}) == (f"MLX's (DSPARK_NATIVE=0; the native kernel is built ({isa}))", "float32")
    assert report({"DSPARK_NATIVE": ""}) == (f"MLX's for float32 products (DSPARK_NATIVE=1 routes them too), "
                                             f"native panel kernel ({isa}) for quantized ones (--precision stored)",
                                             "stored")
    assert report({"DSPARK_NATIVE": "1"}) == (f"native panel kernel ({isa}), DSPARK_NATIVE=1", "stored")
    assert megabytes["stored"] <= 130 and megabytes["float32"] > 4 * megabytes["stored"], megabytes


# ---------------------------------------------------------------- attention (softmax.inc)

def _masked_softmax(s: mx.array, offset: int) -> mx.array:
    """MLX's softmax of scores [..., L, S] with the keys after each query (row i at offset + i) masked."""
    rows, cols = (offset + mx.arange(s.shape[-2]))[:, None], mx.arange(s.shape[-1])[None]
    return mx.softmax(mx.where(cols <= rows, s, -mx.inf), axis=-1, precise=True)


@pytest.mark.parametrize("shape", [(9, 512, 4096), (3, 7, 19), (2, 1, 5), (4, 33, 33), (1, 64, 100), (3, 17, 200)])
@pytest.mark.parametrize("threads", [1, 2])
def test_causal_softmax_equals_masked_softmax(ext, shape, threads):
    """The kernel against MLX's softmax over the causally masked scores: equal within 1e-5 of the row
    maximum, whole vectors and tails alike, and exactly 0 on every masked key."""
    heads, rows, keys = shape
    mx.random.seed(rows)
    s = mx.random.normal((1, heads, rows, keys)) * 8
    got = ext.causal_softmax(s, keys - rows, threads)
    assert _rel_err(got, _masked_softmax(s, keys - rows)) < 1e-5
    future = mx.arange(keys)[None] > (keys - rows + mx.arange(rows))[:, None]  # [L, S]
    assert not mx.any(mx.where(future, got, 0)).item()


def test_causal_softmax_avx2_build(ext):
    """The AVX2 build of the softmax kernel against MLX's masked softmax."""
    code = ("import engine, mlx.core as mx, engine.native as n; e = n.load(); print(e.instruction_set())\n"
            "for h, l, s in ((3, 7, 19), (2, 40, 300)):\n"
            "    x = mx.random.normal((1, h, l, s)) * 8; o = s - l\n"
            "    rows, cols = (o + mx.arange(l))[:, None], mx.arange(s)[None]\n"
            "    want = mx.softmax(mx.where(cols <= rows, x, -mx.inf), axis=-1, precise=True)\n"
            "    d = mx.max(mx.abs(e.causal_softmax(x, o, 1) - want))\n"
            "    assert d.item() < 1e-5, (h, l, s, d.item())\n")
    run_under_avx2(code)


def test_bad_scores_are_refused(ext):
    """float16 scores, a vector, or a negative offset raise instead of computing something wrong."""
    for args in [(mx.zeros((2, 3), dtype=mx.float16), 1), (mx.zeros((3,)), 0), (mx.zeros((2, 3)), -1)]:
        with pytest.raises(ValueError):
            ext.causal_softmax(*args)


@pytest.mark.parametrize("heads, kv_heads, rows, keys", [(9, 3, 64, 64), (9, 3, 70, 300), (4, 4, 65, 65), (8, 2, 100, 130)])
def test_prompt_chunk_attention_equals_mlx_attention(ext, heads, kv_heads, rows, keys):
    """Grouped-query attention of a chunk (its queries the last `rows` positions) equals MLX's
    scaled_dot_product_attention with the causal mask, within 1e-5."""
    from engine.native.attention import causal_attention

    mx.random.seed(keys)
    q = mx.random.normal((1, heads, rows, 64))
    k, v = mx.random.normal((1, kv_heads, keys, 64)), mx.random.normal((1, kv_heads, keys, 64))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert _rel_err(causal_attention(q, k, v, 0.125, ext), want) < 1e-5


@pytest.mark.parametrize("heads, kv_heads, rows, keys, dim",
                         [(9, 3, 1, 129, 64), (9, 3, 8, 129, 64), (9, 3, 17, 300, 64), (4, 4, 1, 5, 64),
                          (8, 2, 3, 40, 48), (2, 1, 5, 5, 20)])
@pytest.mark.parametrize("threads", [1, 2])
def test_few_row_attention_equals_mlx_attention(ext, heads, kv_heads, rows, keys, dim, threads):
    """A decode step's or a verify round's attention, read in place from a cache buffer's slice (and
    from keys strided along D), equals MLX's with the causal mask within 1e-5."""
    mx.random.seed(keys + rows)
    k_buf, v_buf = mx.random.normal((1, kv_heads, 512, dim)), mx.random.normal((1, kv_heads, 512, dim))
    k, v = k_buf[..., :keys, :], v_buf[..., :keys, :]  # as KVCache.update_and_fetch returns them
    q = mx.random.normal((1, rows, heads, dim)).transpose(0, 2, 1, 3)
    mask = "causal" if rows > 1 else None
    scale = dim**-0.5
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    assert _rel_err(ext.few_row_attention(q, k, v, scale, threads), want) < 1e-5
    k_t = mx.random.normal((1, kv_heads, dim, keys)).swapaxes(-1, -2)  # stride along D != 1
    want = mx.fast.scaled_dot_product_attention(q, k_t, v, scale=scale, mask=mask)
    assert _rel_err(ext.few_row_attention(q, k_t, v, scale, threads), want) < 1e-5


def test_few_row_attention_rows_do_not_depend_on_the_row_count(ext):
    """Each of 8 rows verified together is bit-identical to that row decoded alone over the keys it
    sees, so speculative rounds compute exactly what plain decoding does."""
    mx.random.seed(5)
    k, v, q = mx.random.normal((1, 3, 130, 64)), mx.random.normal((1, 3, 130, 64)), mx.random.normal((1, 9, 8, 64))
    together = ext.few_row_attention(q, k, v, 0.125, 2)
    for i in range(8):
        seen = 130 - 8 + i + 1
        alone = ext.few_row_attention(q[:, :, i : i + 1], k[:, :, :seen], v[:, :, :seen], 0.125, 1)
        assert mx.array_equal(alone[:, :, 0], together[:, :, i]).item(), i


def test_few_row_attention_avx2_build(ext):
    """The AVX2 build of the few-row attention kernel against MLX's."""
    code = ("import engine, mlx.core as mx, engine.native as n; e = n.load(); print(e.instruction_set())\n"
            "for h, kv, l, s, d in ((9, 3, 1, 129, 64), (8, 2, 5, 40, 20)):\n"
            "    q = mx.random.normal((1, h, l, d)); k = mx.random.normal((1, kv, s, d)); v = mx.random.normal((1, kv, s, d))\n"
            "    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask='causal' if l > 1 else None)\n"
            "    d = mx.max(mx.abs(e.few_row_attention(q, k, v, 0.125, 1) - want))\n"
            "    assert d.item() < 1e-5, (h, l, s, d.item())\n")
    run_under_avx2(code)


def test_bad_attention_inputs_are_refused(ext):
    """float16, heads that are not a multiple of the key heads, or more queries than keys raise."""
    q, k = mx.zeros((1, 4, 2, 8)), mx.zeros((1, 2, 5, 8))
    for args in [(q.astype(mx.float16), k, k), (mx.zeros((1, 3, 2, 8)), k, k), (mx.zeros((1, 4, 6, 8)), k, k),
                 (q, k, mx.zeros((1, 2, 4, 8)))]:
        with pytest.raises(ValueError):
            ext.few_row_attention(*args, 0.5)


def test_routed_target_attention_takes_the_kernels(stored_smollm2):
    """A routed target's prompt chunk (>= MIN_ROWS rows) takes the BLAS products around the softmax
    kernel in every layer, within 1e-4 of MLX's attention; a verify round (17 rows) takes
    few_row_attention in every layer; the model called directly, outside a Target, keeps MLX's."""
    from engine.models.target import Target
    from engine.native import attention

    model, _ = stored_smollm2
    target = Target(model)

    def logits(ids, routed):
        setattr(model, attention._MARK, routed)  # as route_attention left it, or as if it had not run
        try:
            cache = target.make_cache()
            out = target.logits(mx.array([ids[:80]]), cache)
            if len(ids) > 80:
                out = target.logits(mx.array([ids[80:]]), cache)
            return out
        finally:
            setattr(model, attention._MARK, True)

    ids = [(7 * i) % 40000 + 100 for i in range(97)]  # a chunk of 80, then a round of 17
    prompt_on, prompt_off = logits(ids[:80], True)[0, -1], logits(ids[:80], False)[0, -1]
    assert not mx.array_equal(prompt_on, prompt_off).item()  # the kernel ran
    assert _rel_err(prompt_on, prompt_off) < 1e-4
    chunks, rounds = [], []
    ext = native.load()

    class Spy:
        def causal_softmax(self, s, *args):
            chunks.append(s.shape)
            return ext.causal_softmax(s, *args)

        def few_row_attention(self, q, *args):
            rounds.append(q.shape)
            return ext.few_row_attention(q, *args)

    module = sys.modules[type(model.model.layers[0].self_attn).__module__]
    routed = module.scaled_dot_product_attention
    module.scaled_dot_product_attention = attention._routed(routed, Spy())  # the same routing, spied on
    try:
        out = logits(ids, True)
        model(mx.array([ids[:80]]))  # outside a Target: MLX's attention
    finally:
        module.scaled_dot_product_attention = routed
    assert [shape[3] for shape in chunks] == [80] * 30  # [B, Hkv, rep, L, S]: the chunk in every layer
    assert [shape[2] for shape in rounds] == [17] * 30  # the round in every layer; the direct call in none
    assert out.shape == (1, 17, 49152)


# ---------------------------------------------------------------- quantized panels (qpanel.inc)

QSHAPES = [(576, 576, 32), (192, 576, 32), (1536, 576, 32), (576, 1536, 32), (37, 64, 32), (129, 128, 64),
           (8, 32, 32)]  # (N, K, group size)


def _quantized(n: int, k: int, group: int, bits: int, seed: int):
    """An MLX affine-quantized random weight with float16 scales and biases, as GGUF files store them."""
    mx.random.seed(seed)
    w, s, b = mx.quantize(mx.random.normal((n, k)) * 0.05, group_size=group, bits=bits)
    return w, s.astype(mx.float16), b.astype(mx.float16)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 16])
def test_quantized_linear_equals_dequantize_and_matmul(ext, bits, rows):
    """The quantized panel kernel on pack_quantized(...) against mx.dequantize (float32 arithmetic)
    and mx.matmul: within 1e-5 relative for every shape (odd N pads the last panel, group 32 and
    64), 1 or 2 threads."""
    for n, k, group in QSHAPES:
        w, s, b = _quantized(n, k, group, bits, seed=rows)
        dense = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=group, bits=bits)
        qp, sp, bp = native.pack_quantized(w, s, b, bits, group)
        assert qp.shape == ((n + 15) // 16, k * bits // 8, 16) and sp.shape == bp.shape == ((n + 15) // 16, k // group, 16)
        x = mx.random.normal((1, rows, k))
        want = x @ dense.T
        for threads in (1, 2):
            got = ext.quantized_linear(x, qp, sp, bp, n, bits, group, threads)
            assert got.shape == want.shape and got.dtype == mx.float32
            assert _rel_err(got, want) < 1e-5, (bits, rows, n, k, group, threads)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_rows_do_not_depend_on_the_row_count(ext, bits):
    """As for the float32 panels: a row computed beside 8 others is bit-identical to it alone."""
    w, s, b = _quantized(1536, 576, 32, bits, seed=5)
    qp, sp, bp = native.pack_quantized(w, s, b, bits, 32)
    x = mx.random.normal((1, 9, 576))
    together = ext.quantized_linear(x, qp, sp, bp, 1536, bits, 32)
    for r in range(9):
        alone = ext.quantized_linear(x[:, r : r + 1], qp, sp, bp, 1536, bits, 32)
        assert mx.array_equal(alone[0, 0], together[0, r]).item(), r


def test_quantized_avx2_build(ext):
    """The AVX2 build of the quantized kernel against mx.dequantize + matmul, both bit widths."""
    code = ("import engine, mlx.core as mx, engine.native as n; e = n.load(); print(e.instruction_set())\n"
            "for bits in (4, 8):\n"
            "    mx.random.seed(bits); w, s, b = mx.quantize(mx.random.normal((129, 64)), group_size=32, bits=bits)\n"
            "    s, b = s.astype(mx.float16), b.astype(mx.float16); q = n.pack_quantized(w, s, b, bits, 32)\n"
            "    dense = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=32, bits=bits)\n"
            "    for r in (1, 3, 4, 7, 16):\n"
            "        x = mx.random.normal((r, 64)); want = x @ dense.T\n"
            "        d = mx.max(mx.abs(e.quantized_linear(x, *q, 129, bits, 32) - want)) / mx.max(mx.abs(want))\n"
            "        assert d.item() < 1e-5, (bits, r, d.item())\n")
    run_under_avx2(code)


def test_bad_quantized_inputs_are_refused(ext):
    """float32 scales, 3 bits, a group that does not divide K, or codes of the wrong size raise."""
    w, s, b = _quantized(32, 64, 32, 4, seed=0)
    qp, sp, bp = native.pack_quantized(w, s, b, 4, 32)
    x = mx.zeros((1, 64))
    for args in [(x, qp, sp.astype(mx.float32), bp, 32, 4, 32), (x, qp, sp, bp, 32, 3, 32),
                 (x, qp, sp, bp, 32, 4, 48), (x, qp, sp, bp, 32, 8, 32), (x, qp, sp, bp, 33, 4, 32)]:
        with pytest.raises(ValueError):
            ext.quantized_linear(*args)


@pytest.fixture(scope="module")
def stored_smollm2(ext):
    """The default model at its stored precision (4-bit linears, 8-bit tied embedding), loaded as
    `--precision stored` loads it: every quantized product routed through the kernel, the tied
    table kept once (as the head's panels), and its weights within issue 25's 130 MB."""
    from engine.loading.target import load_target, weight_bytes
    from engine.native.linear import QuantizedPanelEmbedding, QuantizedPanelLinear

    os.environ.pop("DSPARK_NATIVE", None)
    model, tok, path = load_target(None, precision="stored")
    assert path.name.endswith("-stored")
    assert sum(isinstance(m, QuantizedPanelLinear) for _, m in model.named_modules()) == 30 * 7 + 1
    assert not any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())
    assert isinstance(model.model.embed_tokens, QuantizedPanelEmbedding)
    assert weight_bytes(model) <= 130e6
    return model, tok


def test_panel_embedding_rows_equal_mlx_lookups(stored_smollm2, monkeypatch):
    """Rows gathered from the tied head's panels equal MLX's own quantized-embedding lookups, for ids
    at panel edges and the last id."""
    from engine.loading.default_model import default_model_dir
    from engine.loading.target import load_target

    monkeypatch.setenv("DSPARK_NATIVE", "0")  # MLX's QuantizedEmbedding, unrouted
    plain = load_target(str(default_model_dir("stored")))[0]
    ids = mx.array([[0, 1, 15, 16, 17, 31, 32, 12345, 49151]])
    assert mx.array_equal(stored_smollm2[0].model.embed_tokens(ids), plain.model.embed_tokens(ids)).item()


def test_stored_precision_is_lossless_across_modes(stored_smollm2, default_model_dir):
    """At stored precision, speculative rounds (a corrupted replay of the model's own greedy: mixed
    acceptance, rejections, bonus tokens) and lookup drafting both give the model's plain greedy
    token for token: verify rows through the kernel are bit-identical to decode rows."""
    from engine.api import SpecStats
    from engine.lookup import LookupDrafter
    from engine.models.target import Target
    from engine.sampling import SamplerSettings
    from engine.samplers import make_sampler
    from engine.scheduler import Scheduler
    from engine.spec import DecodeOptions, SpecDecoder
    from engine.text import apply_chat_template
    from tests.engine import tiny
    from tests.engine.references import cached_plain_greedy
    from tests.engine.smollm2_cases import QUESTIONS

    model, tok = stored_smollm2
    prompts = [apply_chat_template(tok, [{"role": "user", "content": q}]) for q in QUESTIONS[:2]]
    prompts.append(apply_chat_template(tok, [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, "
                                                                          "the cat sat on the mat, the cat sat"}]))
    lookup_accepted = 0
    for i, prompt in enumerate(prompts):
        # The 128-token entries test_smollm2_spec.py reads for the same model and questions.
        own = cached_plain_greedy(default_model_dir, model, prompt, 128)[:40]
        target = Target(model, (2, 14, 26))
        drafters = {"dspark": tiny.OracleDrafter(target, reference=prompt + own, corrupt_every=(3, 4, 7)[i], vocab=49152),
                    "lookup": LookupDrafter()}
        for mode, drafter in drafters.items():
            opts = DecodeOptions(make_sampler(SamplerSettings(), "rejection", 0), stop_ids=frozenset())
            dec = SpecDecoder(target if mode == "dspark" else Target(model), drafter, Scheduler(4), opts,
                              SpecStats(mode=mode, cap=4))
            if mode == "dspark":
                drafter.committed = dec.committed_view()
            out = dec.prefill(prompt)
            while len(out) < len(own):
                out += dec.step(len(own) - len(out))
            assert out[: len(own)] == own, (i, mode)
            if mode == "dspark":
                assert 0 < dec.stats.accepted_tokens < dec.stats.drafted_tokens
            else:
                lookup_accepted += dec.stats.accepted_tokens
    assert lookup_accepted > 0  # the repeating prompt really was drafted from
