"""Tests for the drafter config, MLX module and strict loader (docs/method.md §3, §4).

Tiny checkpoints are written by `drafter_fixtures` with the real tensor names of each layout.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import engine  # noqa: F401  (loads the fast BLAS; must come before mlx.core)

# isort: split
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine.loading import hub
from engine.loading.drafter import (
    DrafterLoadError,
    load_drafter,
    lookup_published_drafter,
    save_drafter,
    target_base_name,
)
from engine.models.drafter import Drafter, quantize_drafter
from engine.models.drafter_config import (
    DrafterConfigError,
    build_target_layer_ids,
    normalize_drafter_config,
)
from tests.engine import drafter_fixtures as fx

CTX_WIDTH = len(fx.TAPS) * fx.HIDDEN


def _load(path, **kw):
    kw.setdefault("target_vocab_size", fx.VOCAB)
    return load_drafter(str(path), target_num_layers=fx.TARGET_LAYERS, target_hidden_size=fx.HIDDEN, **kw)


def _bind(drafter):
    table = fx.fake_target_embedding()
    embed = nn.Embedding(fx.VOCAB, fx.HIDDEN)
    embed.weight = table
    return drafter.bind_target(embed, embed.as_linear)


def _block(anchor: int = 5) -> mx.array:
    return mx.array([[anchor] + [fx.MASK_ID] * (fx.BLOCK - 1)])  # [1, B]


def _ctx(rows: int, seed: int = 3) -> mx.array:
    return mx.random.normal((1, rows, CTX_WIDTH), key=mx.random.key(seed))  # [1, rows, m*d]


def _params(drafter) -> dict:
    return dict(tree_flatten(drafter.parameters()))


@pytest.fixture
def deepspec(tmp_path):
    return _load(fx.write_deepspec(tmp_path / "deepspec"))


@pytest.fixture
def dflash(tmp_path):
    drafter, cfg = _load(fx.write_dflash(tmp_path / "dflash"))
    return _bind(drafter), cfg


# ---------------------------------------------------------------- loading


def test_deepspec_layout_loads_strictly_and_runs(tmp_path, deepspec):
    """A DeepSpec checkpoint loads with exactly its tensors, as float32, and drafts B rows."""
    drafter, cfg = deepspec
    assert set(_params(drafter)) == set(fx.deepspec_shapes())
    assert all(v.dtype == mx.float32 for v in _params(drafter).values())
    assert (cfg.layout, cfg.draft_slot_offset, cfg.max_drafts) == ("deepspec", 0, fx.BLOCK)
    h = drafter.backbone(_ctx(6), _block(), drafter.make_cache())
    assert h.shape == (1, fx.BLOCK, fx.HIDDEN)
    assert drafter.base_logits(drafter.draft_hidden(h)).shape == (1, fx.BLOCK, fx.VOCAB)


def test_dflash_layout_loads_ignores_auto_map_and_binds_target(tmp_path, dflash):
    """A z-lab checkpoint (with auto_map) loads, has no embed/lm_head, and uses the bound target's."""
    drafter, cfg = dflash
    assert set(_params(drafter)) == set(fx.backbone_shapes())
    assert (cfg.layout, cfg.draft_slot_offset, cfg.max_drafts) == ("dflash", 1, fx.BLOCK - 1)
    h = drafter.backbone(_ctx(6), _block(), drafter.make_cache())
    rows = drafter.draft_hidden(h)
    assert rows.shape == (1, fx.BLOCK - 1, fx.HIDDEN)
    assert mx.array_equal(rows, h[:, 1:])
    expected = h @ fx.fake_target_embedding().T
    assert mx.allclose(drafter.base_logits(h), expected, atol=1e-5)


def test_unbound_dflash_drafter_says_to_bind(tmp_path):
    """Running a z-lab drafter before binding the target fails with instructions, not a KeyError."""
    drafter, _ = _load(fx.write_dflash(tmp_path / "d"))
    assert drafter.needs_target_binding
    with pytest.raises(RuntimeError, match="bind_target"):
        drafter.backbone(_ctx(2), _block(), drafter.make_cache())


def test_bind_target_model_uses_tied_mlx_lm_embedding(tmp_path):
    """bind_target_model finds an mlx-lm target's embed_tokens and falls back to as_linear when tied."""
    from mlx_lm.models import qwen3

    args = qwen3.ModelArgs(model_type="qwen3", hidden_size=fx.HIDDEN, num_hidden_layers=fx.TARGET_LAYERS,
                           intermediate_size=fx.INTER, num_attention_heads=fx.HEADS, rms_norm_eps=1e-6,
                           vocab_size=fx.VOCAB, num_key_value_heads=fx.KV_HEADS, max_position_embeddings=512,
                           head_dim=fx.HEAD_DIM, tie_word_embeddings=True, rope_theta=1e6)
    target = qwen3.Model(args)
    drafter, _ = _load(fx.write_dflash(tmp_path / "d"))
    drafter.bind_target_model(target)
    h = drafter.backbone(_ctx(3), _block(), drafter.make_cache())
    assert mx.allclose(drafter.base_logits(h), target.model.embed_tokens.as_linear(h), atol=1e-5)


def test_nested_block_size_rope_parameters_and_sharded_weights_load(tmp_path):
    """Newer z-lab packaging (nested block_size, rope_parameters) loads from a sharded checkpoint."""
    drafter, cfg = _load(fx.write_dflash(tmp_path / "d", nested_block_size=True, shards=3))
    assert cfg.block_size == fx.BLOCK and cfg.rope_theta == 1e6 and cfg.rope_scaling is None
    assert set(_params(drafter)) == set(fx.backbone_shapes())


def test_legacy_dspark_uses_deepspec_slots_with_heads(tmp_path):
    """Legacy SpecForge DSparkDraftModel: DeepSpec slot convention, Markov + confidence, target embedding."""
    drafter, cfg = _load(fx.write_legacy_dspark(tmp_path / "l"))
    assert (cfg.layout, cfg.max_drafts, cfg.markov_rank, cfg.confidence_head_with_markov) == \
        ("deepspec", fx.BLOCK, fx.RANK, True)
    assert drafter.needs_target_binding
    h = _bind(drafter).backbone(_ctx(2), _block(), drafter.make_cache())
    assert drafter.confidence_logits(h[0], mx.array([5, 1, 2, 3])).shape == (fx.BLOCK,)


def test_missing_key_is_refused_by_name(tmp_path):
    """A checkpoint lacking one tensor is refused, naming the tensor."""
    weights = fx.random_weights(fx.deepspec_shapes())
    del weights["layers.1.mlp.up_proj.weight"]
    path = fx.write_checkpoint(tmp_path / "m", fx.deepspec_config(), weights)
    with pytest.raises(DrafterLoadError, match=r"1 missing key\(s\): layers\.1\.mlp\.up_proj\.weight"):
        _load(path)


def test_unexpected_key_is_refused_by_name(tmp_path):
    """A checkpoint with an extra tensor is refused, naming it (a 'model.' prefix gets a hint)."""
    weights = fx.random_weights(fx.deepspec_shapes())
    weights["model.norm.weight"] = weights["norm.weight"]
    path = fx.write_checkpoint(tmp_path / "u", fx.deepspec_config(), weights)
    message = r"1 unexpected key\(s\): model\.norm\.weight.*'model\.' prefix"
    with pytest.raises(DrafterLoadError, match=message):
        _load(path)


def test_shape_mismatch_is_refused(tmp_path):
    """A tensor whose shape disagrees with the config is refused with both shapes."""
    weights = fx.random_weights(fx.deepspec_shapes())
    weights["fc.weight"] = mx.zeros((fx.HIDDEN, 3 * fx.HIDDEN))
    path = fx.write_checkpoint(tmp_path / "s", fx.deepspec_config(), weights)
    with pytest.raises(DrafterLoadError, match=r"fc\.weight: checkpoint \(64, 192\) vs expected \(64, 128\)"):
        _load(path)


def test_vocab_mismatch_with_target_is_refused(tmp_path):
    """A drafter whose vocabulary differs from the target's is refused."""
    path = fx.write_deepspec(tmp_path / "v")
    with pytest.raises(DrafterLoadError, match="vocabulary mismatch.*256.*300"):
        _load(path, target_vocab_size=300)


def test_target_depth_mismatch_is_refused(tmp_path):
    """A drafter trained on a different-depth target is refused."""
    path = fx.write_dflash(tmp_path / "t")
    with pytest.raises(DrafterLoadError, match="4-layer target.*this target has 6 layers"):
        load_drafter(str(path), target_vocab_size=fx.VOCAB, target_num_layers=6)


def test_auto_map_with_unknown_architecture_is_refused(tmp_path):
    """An unimplemented architecture that points at remote code is refused without running it."""
    raw = fx.dflash_config(architectures=["FancyDraftModel"])
    path = fx.write_checkpoint(tmp_path / "a", raw, fx.random_weights(fx.backbone_shapes()))
    with pytest.raises(DrafterConfigError, match=r"remote code \(auto_map\) is never executed"):
        _load(path)


def test_unknown_architecture_lists_supported_ones():
    """An unknown architecture without auto_map names the supported ones."""
    with pytest.raises(DrafterConfigError, match="unknown drafter architecture 'Foo'.*Qwen3DSparkModel"):
        normalize_drafter_config(fx.deepspec_config(architectures=["Foo"]))


def test_other_gemma_drafters_are_refused_clearly():
    """Only DeepSpec's Gemma4DSparkModel is implemented: other Gemma drafters name it, and a
    Gemma4DSparkModel config without the Gemma keys says which are missing."""
    raw = fx.deepspec_config(architectures=["Gemma3DSparkModel"], model_type="gemma3_text")
    with pytest.raises(DrafterConfigError, match="only Gemma drafter implemented is DeepSpec's Gemma4DSparkModel"):
        normalize_drafter_config(raw)
    raw = fx.deepspec_config(architectures=["Gemma4DSparkModel"], model_type="gemma4_text")
    with pytest.raises(DrafterConfigError, match="missing global_head_dim"):
        normalize_drafter_config(raw)


def test_tap_on_final_target_layer_is_refused(tmp_path):
    """A tap on the target's last layer (post-norm in HF hidden_states) is refused with the reason."""
    path = fx.write_checkpoint(tmp_path / "f", fx.deepspec_config(target_layer_ids=[0, 3]),
                               fx.random_weights(fx.deepspec_shapes()))
    with pytest.raises(DrafterConfigError, match="final target layer 3.*post-final-norm"):
        _load(path)


def test_missing_geometry_is_refused():
    """A config without hidden_size or rope_theta is refused, naming the key."""
    raw = fx.deepspec_config()
    del raw["hidden_size"]
    with pytest.raises(DrafterConfigError, match="missing required geometry: hidden_size"):
        normalize_drafter_config(raw)
    raw = fx.dflash_config(nested_block_size=True, rope_parameters={"rope_type": "default"})
    with pytest.raises(DrafterConfigError, match="rope_theta"):
        normalize_drafter_config(raw)


def test_default_taps_follow_z_lab_spread_rule():
    """Without target_layer_ids the taps are spread over [1, n_target - 3] (Qwen3-4B: 1, 9, ..., 33)."""
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    raw = fx.dflash_config(num_target_layers=36, num_hidden_layers=5)
    del raw["dflash_config"]["target_layer_ids"]
    assert normalize_drafter_config(raw).target_layer_ids == (1, 9, 17, 25, 33)


def test_offline_hub_id_gives_a_clear_error(monkeypatch):
    """An uncached Hub id while offline is a DrafterLoadError that says so, not a raw traceback."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(repo_id, allow_patterns):
        raise LocalEntryNotFoundError("Cannot find the requested files in the disk cache")

    monkeypatch.setattr(hub, "snapshot_download", offline)
    with pytest.raises(DrafterLoadError, match="not in the local Hugging Face cache.*offline"):
        load_drafter("deepseek-ai/dspark_qwen3_4b_block7", target_vocab_size=151936)
    with pytest.raises(DrafterLoadError, match="neither a local directory nor a Hugging Face id"):
        load_drafter("no_such_dir", target_vocab_size=151936)


# ---------------------------------------------------------------- save / config round trip


@pytest.mark.parametrize("writer", [fx.write_deepspec, fx.write_dflash, fx.write_legacy_dspark])
def test_save_then_normalize_round_trips_config_and_weights(tmp_path, writer):
    """save_drafter's config.json normalizes back to an equal DrafterConfig and reloads the same weights."""
    drafter, cfg = _load(writer(tmp_path / "src"))
    if cfg.layout == "deepspec":
        yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
        cfg = replace(cfg, sts_temperatures=(1.5, 0.9, 1.2, 1.1), rope_scaling=yarn)
    out = save_drafter(drafter, cfg, tmp_path / "out", "float32")
    raw = json.loads((out / "config.json").read_text())
    assert normalize_drafter_config(raw) == cfg
    again, cfg2 = _load(out)
    assert cfg2 == cfg
    assert all(mx.array_equal(v, _params(again)[k]) for k, v in _params(drafter).items())


def test_saved_layouts_use_their_own_config_shape(tmp_path, deepspec, dflash):
    """DeepSpec saves top-level DSpark keys; z-lab saves a nested dflash_config."""
    ds = json.loads((save_drafter(*deepspec, tmp_path / "a") / "config.json").read_text())
    assert ds["architectures"] == ["Qwen3DSparkModel"] and ds["target_layer_ids"] == fx.TAPS
    assert ds["markov_rank"] == fx.RANK and "dflash_config" not in ds
    zl = json.loads((save_drafter(*dflash, tmp_path / "b") / "config.json").read_text())
    assert zl["architectures"] == ["DFlashDraftModel"]
    assert zl["dflash_config"] == {"mask_token_id": fx.MASK_ID, "target_layer_ids": fx.TAPS}


# ---------------------------------------------------------------- backbone semantics


@pytest.mark.parametrize("layout", ["deepspec", "dflash"])
def test_incremental_context_cache_matches_reference(layout, deepspec, dflash):
    """The cached path equals a from-scratch recompute after calls with c = 5, 0, 3, 1, 0, 2."""
    drafter, _ = deepspec if layout == "deepspec" else dflash
    ctx_all = _ctx(11, seed=9)  # [1, 11, m*d]
    cache, start = drafter.make_cache(), 0
    for step, rows in enumerate([5, 0, 3, 1, 0, 2]):
        block = _block(anchor=10 + step)
        h = drafter.backbone(ctx_all[:, start:start + rows], block, cache)
        start += rows
        assert drafter.context_length(cache) == start
        ref = drafter.reference_forward(ctx_all[:, :start], block)
        assert mx.allclose(h, ref, atol=1e-4, rtol=1e-4), f"step {step}: {mx.abs(h - ref).max().item()}"


def test_block_attention_is_bidirectional(deepspec):
    """Changing a later block slot's token changes every earlier slot's hidden state."""
    drafter, _ = deepspec
    cache = drafter.make_cache()
    drafter.append_context(_ctx(4), cache)
    base = drafter.backbone(None, _block(), cache)
    changed = mx.array([[5] + [fx.MASK_ID] * (fx.BLOCK - 2) + [17]])  # only the last slot differs
    other = drafter.backbone(None, changed, cache)
    for row in range(fx.BLOCK - 1):
        assert mx.abs(base[0, row] - other[0, row]).max().item() > 1e-4, f"row {row} did not change"


def test_block_never_enters_the_context_cache(deepspec):
    """A block call leaves the cached context length unchanged and repeats identically."""
    drafter, _ = deepspec
    cache = drafter.make_cache()
    first = drafter.backbone(_ctx(3), _block(), cache)
    assert drafter.context_length(cache) == 3
    again = drafter.backbone(_ctx(0), _block(), cache)
    assert drafter.context_length(cache) == 3
    assert mx.array_equal(first, again)


def test_context_goes_through_fc_and_hidden_norm_but_not_input_layernorm(deepspec):
    """Cached keys equal k_norm(k_proj(hidden_norm(fc(taps)))) with RoPE at positions 0..c-1."""
    drafter, _ = deepspec
    cache, taps = drafter.make_cache(), _ctx(3)
    drafter.append_context(taps, cache)
    attn = drafter.layers[0].self_attn
    ctx_h = drafter.hidden_norm(drafter.fc(taps))
    keys = attn.k_norm(attn.k_proj(ctx_h).reshape(1, 3, fx.KV_HEADS, fx.HEAD_DIM)).transpose(0, 2, 1, 3)
    keys = mx.fast.rope(keys, fx.HEAD_DIM, traditional=False, base=1e6, scale=1.0, offset=0)
    assert mx.allclose(cache[0].keys_and_values()[0], keys, atol=1e-5)


# ---------------------------------------------------------------- heads


def test_markov_bias_and_confidence_match_their_formulas(deepspec):
    """Markov bias is W1[prev] @ W2^T; confidence is proj([h ; W1[prev]]) before the sigmoid."""
    drafter, _ = deepspec
    head = drafter.markov_head
    prev = mx.array([5, 17, 250, 0])  # [n]
    w1 = head.markov_w1.weight[prev]  # [n, r]
    assert mx.allclose(drafter.markov_bias(prev), w1 @ head.markov_w2.weight.T, atol=1e-5)
    h = drafter.backbone(_ctx(2), _block(), drafter.make_cache())[0]  # [B, d]
    proj = drafter.confidence_head.proj
    expected = (mx.concatenate([h, w1], axis=-1) @ proj.weight.T + proj.bias)[:, 0]
    assert mx.allclose(drafter.confidence_logits(h, prev), expected, atol=1e-5)


def test_gated_loads_and_rnn_markov_head_is_refused_at_load_but_steps(tmp_path):
    """Gated heads load with their extra tensors; rnn checkpoints are refused at load (not servable),
    while the rnn head module itself still follows the DeepSpec formulas."""
    prev, h = mx.array([5, 9]), mx.random.normal((2, fx.HIDDEN), key=mx.random.key(4))
    gated, gated_cfg = _load(fx.write_deepspec(tmp_path / "g", markov_head_type="gated"))
    head = gated.markov_head
    emb = head.markov_w1(prev)
    gate = mx.sigmoid(head.gate_proj(mx.concatenate([h, emb], axis=-1)))
    assert mx.allclose(gated.markov_bias(prev, h), head.markov_w2(gate * emb), atol=1e-5)
    with pytest.raises(DrafterConfigError, match="rnn Markov head.*not supported"):
        _load(fx.write_deepspec(tmp_path / "r", markov_head_type="rnn"))
    rnn = Drafter(replace(gated_cfg, markov_head_type="rnn"))  # built directly: the loader refuses it
    state = rnn.markov_init_state(2)
    bias1, state = rnn.markov_step(prev, h, state)
    bias2, state = rnn.markov_step(prev, h, state)
    assert bias1.shape == (2, fx.VOCAB) and state.shape == (2, fx.RANK)
    assert not mx.allclose(bias1, bias2)  # the state carries history between steps
    with pytest.raises(ValueError, match="stateful"):
        rnn.markov_bias(prev, h)


# ---------------------------------------------------------------- quantization


def _relative_error(a: mx.array, b: mx.array) -> float:
    return (mx.linalg.norm(a - b) / mx.linalg.norm(b)).item()


@pytest.mark.parametrize("mode,tol", [("bf16", 0.03), ("8bit", 0.03), ("4bit", None)])
def test_quantize_modes_run_and_stay_close(tmp_path, mode, tol):
    """bf16 / 8-bit drafters stay close to fp32 on h, logits and heads; 4-bit runs and is finite."""
    path = fx.write_deepspec(tmp_path / "q")
    ref, _ = _load(path)
    quant, _ = _load(path, quantize=mode)
    if mode != "bf16":
        assert isinstance(quant.fc, nn.QuantizedLinear) and isinstance(quant.lm_head, nn.QuantizedLinear)
        assert isinstance(quant.confidence_head.proj, nn.Linear)
    prev = mx.array([5, 1, 2, 3])
    outs = []
    for drafter in (ref, quant):
        h = drafter.backbone(_ctx(5), _block(), drafter.make_cache())
        outs.append((h.astype(mx.float32), drafter.base_logits(h), drafter.markov_bias(prev),
                     drafter.confidence_logits(h[0], prev)))
    for got, want in zip(outs[1], outs[0]):
        assert got.dtype == mx.float32 and mx.all(mx.isfinite(got)).item()
        if tol is not None:
            assert _relative_error(got, want) < tol


def test_unknown_quantize_mode_is_refused(deepspec):
    """quantize_drafter rejects modes it does not know."""
    with pytest.raises(ValueError, match="unknown drafter quantization"):
        quantize_drafter(deepspec[0], "3bit")


# ---------------------------------------------------------------- registry


def test_published_drafter_lookup_ignores_org_and_quantization():
    """Known targets resolve per mode regardless of org or quantization suffix; others give None."""
    assert lookup_published_drafter("Qwen/Qwen3-4B") == "deepseek-ai/dspark_qwen3_4b_block7"
    assert lookup_published_drafter("mlx-community/Qwen3-4B-4bit", "dflash") == "z-lab/Qwen3-4B-DFlash-b16"
    assert lookup_published_drafter("/models/Qwen3-8B-MLX-8bit") == "deepseek-ai/dspark_qwen3_8b_block7"
    assert lookup_published_drafter("mlx-community/Qwen3-14B-8bit") == "deepseek-ai/dspark_qwen3_14b_block7"
    assert lookup_published_drafter("Qwen/Qwen3-14B", "dflash") is None
    gemma = lookup_published_drafter("mlx-community/gemma-4-12b-it-bf16")
    assert gemma == "deepseek-ai/dspark_gemma4_12b_block7"
    assert lookup_published_drafter("Qwen/Qwen3-4B-Instruct-2507") is None
    assert target_base_name("mlx-community/Qwen3-4B-4bit-DWQ-053125") == "qwen3-4b"
