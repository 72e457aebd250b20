"""The Gemma-4 DSpark drafter (DeepSpec `Gemma4DSparkModel`): config, loading, forward, logits order, rounds.

Tiny random checkpoints from `tests.engine.gemma_drafter_fixtures`, written under the published
tensor names; numerical parity with DeepSpec's own PyTorch module is checked separately by
scripts/gemma4_drafter_parity.py (docs/bench-runs/2026-12-06-gemma4-drafter-parity).
"""

import math

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from engine.loading.drafter import DrafterLoadError, load_drafter
from engine.models.drafter import draft_logits
from engine.models.drafter_config import DrafterConfigError, drafter_config_to_raw, normalize_drafter_config
from tests.engine import drafter_fixtures as fx
from tests.engine import gemma_drafter_fixtures as gx
from tests.engine import tiny
from tests.engine.test_spec import PROMPTS, TIE_EPS, first_divergence, make_decoder, run, top2_gap

GEMMA_12B = {  # the published drafter's geometry (docs/method.md §4.1, §4.2)
    "hidden_size": 3840, "vocab_size": 262144, "intermediate_size": 15360, "num_attention_heads": 16,
    "num_key_value_heads": 8, "num_global_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
    "num_hidden_layers": 5, "block_size": 7, "markov_rank": 256,
}


def _load(path, **kw):
    return load_drafter(str(path), target_vocab_size=fx.VOCAB, target_num_layers=fx.TARGET_LAYERS,
                        target_hidden_size=fx.HIDDEN, **kw)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """A loaded tiny Gemma-4 drafter paired with the tiny llama target's geometry, and its config."""
    path = gx.write_gemma4_dspark(tmp_path_factory.mktemp("gemma"), hidden_size=fx.HIDDEN,
                                  num_target_layers=fx.TARGET_LAYERS, vocab_size=fx.VOCAB,
                                  target_layer_ids=fx.TAPS, seed=5)
    return _load(path)


def _ctx(rows: int, seed: int = 0) -> mx.array:
    return mx.random.normal((1, rows, len(fx.TAPS) * fx.HIDDEN), key=mx.random.key(seed))


def _block(anchor: int = 9) -> mx.array:
    return mx.array([[anchor] + [gx.GEMMA_MASK_ID] * 3])


# ---------------------------------------------------------------- config


def test_config_reads_the_gemma_keys():
    """Family, head geometry (global_head_dim, K = V heads), soft cap and full-attention RoPE."""
    cfg = normalize_drafter_config(gx.gemma4_dspark_config())
    assert (cfg.family, cfg.layout, cfg.architecture) == ("gemma4", "deepspec", "Gemma4DSparkModel")
    assert cfg.owns_embeddings and not cfg.tie_word_embeddings
    assert (cfg.attn_head_dim, cfg.attn_kv_heads, cfg.head_dim) == (32, 1, 16)
    assert cfg.attention_k_eq_v and cfg.final_logit_softcapping == 30.0
    assert cfg.hidden_activation == "gelu_pytorch_tanh"
    assert cfg.rope_theta == 1e6  # the full-attention entry, not the sliding one (1e4)
    assert cfg.rope_scaling == {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    assert cfg.max_drafts == cfg.block_size == 4  # DeepSpec slot convention: B drafts


def test_config_of_the_published_12b_geometry():
    """The Gemma-4-12B drafter's numbers parse to 512-wide heads with one shared K = V head."""
    raw = gx.gemma4_dspark_config(num_target_layers=48, target_layer_ids=[5, 17, 29, 41, 46], **GEMMA_12B)
    cfg = normalize_drafter_config(raw)
    assert (cfg.attn_head_dim, cfg.attn_kv_heads, cfg.num_taps, cfg.max_drafts) == (512, 1, 5, 7)


def test_config_without_k_eq_v_uses_the_ordinary_kv_heads():
    cfg = normalize_drafter_config(gx.gemma4_dspark_config(attention_k_eq_v=False))
    assert (cfg.attn_head_dim, cfg.attn_kv_heads) == (32, 2)


@pytest.mark.parametrize(("override", "message"), [
    ({"enable_moe_block": True}, "MoE block"),
    ({"hidden_size_per_layer_input": 256}, "per-layer input gates"),
    ({"use_double_wide_mlp": True, "num_kv_shared_layers": 2}, "double-wide"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, r"rope_parameters\['full_attention'\]"),
    ({"global_head_dim": None}, "missing global_head_dim"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window"),
    ({"markov_head_type": "rnn"}, "rnn Markov head"),
    ({"final_logit_softcapping": 0.0}, "must be positive"),
])
def test_unsupported_variants_are_refused_with_the_reason(override, message):
    with pytest.raises(DrafterConfigError, match=message):
        normalize_drafter_config(gx.gemma4_dspark_config(**override))


def test_config_round_trips_through_our_writer():
    """drafter_config_to_raw writes a Gemma config that reads back to the same DrafterConfig."""
    for raw in (gx.gemma4_dspark_config(), gx.gemma4_dspark_config(attention_k_eq_v=False,
                                                                    final_logit_softcapping=None)):
        cfg = normalize_drafter_config(raw)
        assert normalize_drafter_config(drafter_config_to_raw(cfg)) == cfg


# ---------------------------------------------------------------- loading


def test_loads_the_published_names_and_owns_its_embeddings(gemma):
    """Every published tensor lands (strict load); no v_proj with K = V; layer_scalar is not trainable."""
    drafter, cfg = gemma
    raw = gx.gemma4_dspark_config(hidden_size=fx.HIDDEN, num_target_layers=fx.TARGET_LAYERS,
                                  vocab_size=fx.VOCAB, target_layer_ids=fx.TAPS)
    params = dict(tree_flatten(drafter.parameters()))
    assert {k: tuple(v.shape) for k, v in params.items()} == gx.gemma4_dspark_shapes(raw)
    assert not drafter.needs_target_binding
    trainable = dict(tree_flatten(drafter.trainable_parameters()))
    assert not [k for k in trainable if k.endswith("layer_scalar")]


def test_loads_the_v_proj_variant(tmp_path):
    """attention_k_eq_v false: a v_proj per layer, shaped by num_key_value_heads."""
    path = gx.write_gemma4_dspark(tmp_path, attention_k_eq_v=False)
    drafter, _ = _load(path)
    assert drafter.layers[0].self_attn.v_proj.weight.shape == (2 * 32, fx.HIDDEN)


def test_a_missing_layer_scalar_is_named(tmp_path):
    raw = gx.gemma4_dspark_config()
    weights = gx.gemma4_dspark_weights(raw)
    del weights["layers.1.layer_scalar"]
    fx.write_checkpoint(tmp_path, raw, weights)
    with pytest.raises(DrafterLoadError, match=r"missing key\(s\): layers\.1\.layer_scalar"):
        _load(tmp_path)


# ---------------------------------------------------------------- forward


def test_shapes(gemma):
    drafter, cfg = gemma
    cache = drafter.make_cache()
    h = drafter.backbone(_ctx(6), _block(), cache)
    assert h.shape == (1, cfg.block_size, fx.HIDDEN)
    rows = drafter.draft_hidden(h)[0]  # [B, d]: DeepSpec slot j drafts p + j + 1
    assert rows.shape == (cfg.block_size, fx.HIDDEN)
    prev = mx.array([9, 1, 2, 3])
    assert drafter.base_logits(rows).shape == (4, fx.VOCAB)
    assert draft_logits(drafter, rows, prev).shape == (4, fx.VOCAB)
    assert drafter.confidence_logits(rows, prev).shape == (4,)
    assert cache[0].keys.shape[1] == 1  # one global KV head cached


def test_incremental_context_cache_matches_reference(gemma):
    """The cached path (K = V, v_norm, partial RoPE) equals a from-scratch recompute."""
    drafter, _ = gemma
    ctx_all, cache, start = _ctx(9, seed=3), drafter.make_cache(), 0
    for step, rows in enumerate([4, 0, 3, 2]):
        block = _block(anchor=20 + step)
        h = drafter.backbone(ctx_all[:, start:start + rows], block, cache)
        start += rows
        ref = drafter.reference_forward(ctx_all[:, :start], block)
        assert mx.allclose(h, ref, atol=1e-4, rtol=1e-4), f"step {step}: {mx.abs(h - ref).max().item()}"


def test_embedding_is_scaled_by_sqrt_hidden(gemma):
    drafter, _ = gemma
    ids = mx.array([[3, 7]])
    expected = drafter.embed_tokens.weight[ids] * math.sqrt(fx.HIDDEN)
    assert mx.allclose(drafter.embed(ids), expected, atol=1e-5)


def test_softcap_comes_before_the_markov_bias(gemma):
    """Draft logits are cap(U) + bias: fails if the bias were added before the soft cap."""
    drafter, cfg = gemma
    rows = drafter.draft_hidden(drafter.backbone(_ctx(5), _block(), drafter.make_cache()))[0]  # [B, d]
    prev = mx.array([9, 4, 4, 4])
    cap = cfg.final_logit_softcapping
    u = drafter.lm_head(rows).astype(mx.float32)  # the raw head, [B, V]
    bias = drafter.markov_head.markov_w2(drafter.markov_head.markov_w1(prev)).astype(mx.float32) * 400.0
    drafter.markov_head.markov_w2.weight = drafter.markov_head.markov_w2.weight * 400.0  # bias >> cap
    try:
        got = draft_logits(drafter, rows, prev)
    finally:
        drafter.markov_head.markov_w2.weight = drafter.markov_head.markov_w2.weight / 400.0
    capped_first = cap * mx.tanh(u / cap) + bias
    bias_first = cap * mx.tanh((u + bias) / cap)
    assert mx.abs(bias).max().item() > 2 * cap  # the two orders really differ here
    assert mx.allclose(got, capped_first, atol=1e-3, rtol=1e-4)
    assert not mx.allclose(got, bias_first, atol=1.0)


def test_base_logits_are_capped_on_a_column_subset_too(gemma):
    """The training shortlist path (vocab columns) gets the same capped values."""
    drafter, cfg = gemma
    rows = drafter.draft_hidden(drafter.backbone(_ctx(3), _block(), drafter.make_cache()))[0] * 50.0
    vocab = mx.array([0, 5, 17, 255])
    full = drafter.base_logits(rows)
    assert mx.abs(full).max().item() <= cfg.final_logit_softcapping
    assert mx.allclose(drafter.base_logits(rows, vocab), mx.take(full, vocab, axis=-1), atol=1e-4)


# ---------------------------------------------------------------- serving


@pytest.fixture(scope="module")
def target():
    return tiny.tiny_target(seed=0, scale=4.0)


@pytest.mark.parametrize("cap", [1, 4])
def test_spec_greedy_rounds_match_plain_greedy(target, gemma, cap):
    """engine/spec.py runs greedy rounds with the Gemma drafter; the ids equal plain greedy (ties aside)."""
    drafter, _ = gemma
    for prompt in PROMPTS[:2]:
        plain = run(make_decoder(target, None, None), prompt, 16)
        dec = make_decoder(target, drafter, cap)
        spec = run(dec, prompt, 16)
        i = first_divergence(plain, spec)
        if i is not None:
            assert top2_gap(target, prompt + plain[:i]) <= TIE_EPS, f"cap {cap}: diverged at {i}"
        assert len(spec) == len(plain)
        assert dec.stats.rounds > 0 and dec.stats.drafted_tokens > 0


def test_sampled_rounds_run_with_the_confidence_head(target, gemma):
    """A temperature-1 request runs (Markov chain + confidence logits feed the round)."""
    from engine.sampling import SamplerSettings

    drafter, _ = gemma
    out = run(make_decoder(target, drafter, 4, settings=SamplerSettings(temperature=1.0), seed=3), PROMPTS[0], 12)
    assert len(out) == 12 and all(0 <= t < fx.VOCAB for t in out)


@pytest.mark.parametrize("mode", ["bf16", "8bit"])
def test_quantized_drafter_runs(tmp_path, mode):
    """bf16 and 8-bit loads run a round's outputs (layer_scalar and v_norm follow the compute dtype)."""
    drafter, cfg = _load(gx.write_gemma4_dspark(tmp_path), quantize=mode)
    rows = drafter.draft_hidden(drafter.backbone(_ctx(4), _block(), drafter.make_cache()))[0]
    logits = draft_logits(drafter, rows, mx.array([9, 1, 2, 3]))
    assert logits.shape == (cfg.block_size, fx.VOCAB) and logits.dtype == mx.float32
    assert mx.isfinite(logits).all().item()
    assert mx.abs(logits - drafter.markov_bias(mx.array([9, 1, 2, 3]))).max().item() <= cfg.final_logit_softcapping + 1e-3
