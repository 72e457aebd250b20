"""Drafter trainer (`engine.train`, `dspark train-drafter`): train/serve consistency, losses,
learning on a tiny target, resume, feature cache, STS and the end-to-end pipeline."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import engine  # noqa: F401  (loads the fast BLAS; must come before mlx.core)

# isort: split
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from engine.loading.drafter import load_drafter
from engine.models.drafter_config import drafter_config_to_raw, normalize_drafter_config
from engine.models.target import Target
from engine.train import checkpoint, precondition, sts
from engine.train.batch import attention_mask, build_batch, sample_anchors, valid_anchors
from engine.train.config import TrainConfig, default_mask_token_id, make_drafter_config
from engine.train.data import Sample, answer_sample, chunk_ids, list_text_files, record_prompt
from engine.train.features import FeatureCacheError, FeatureSource
from engine.train.forward import draft_rows, train_backbone
from engine.train.generate import generate_continuations
from engine.train.loop import Trainer, TrainingStopped
from engine.train.loss import acceptance_estimate, block_losses
from engine.train.model import init_drafter, save_trained
from engine.train.pipeline import DataConfig, OutputDirError, evaluate_saved, run_with_model
from engine.train.progress import ProgressBar
from tests.engine import tiny

MASK_ID = 250


class ByteTokenizer:
    """Byte-level stand-in tokenizer (ids < 240) with a toy chat template; no EOS."""

    eos_token_id = None
    eos_token_ids: list[int] = []
    has_chat_template = True

    def encode(self, text: str) -> list[int]:
        return [b % 240 for b in text.encode()]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        ids: list[int] = []
        for m in messages:
            ids += [241 if m["role"] == "user" else 242] + self.encode(m["content"]) + [243]
        return ids + ([242] if add_generation_prompt else [])


def _quiet(steps: int) -> ProgressBar:
    return ProgressBar(steps, io.StringIO(), tty=False)


def _config(out: Path, **kw) -> TrainConfig:
    base = dict(out=out, num_layers=1, block_size=4, markov_rank=16, taps=(0, 1), steps=40, batch=4, anchors=16,
                lr=3e-3, seq_len=128, checkpoint_every=10, log_every=10, chunk_sequences=8, eval_max_tokens=24,
                mask_token_id=MASK_ID)
    return TrainConfig(**(base | kw))


def _greedy_samples(model, num: int, prompt_len: int, new: int, cache: Path, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 240, size=prompt_len).tolist() for _ in range(num)]
    answers = generate_continuations(model, prompts, new, cache, batch=64, seed=seed)
    return [Sample(p + a, [False] * len(p) + [True] * len(a)) for p, a in zip(prompts, answers)]


def _setup(cfg: TrainConfig, samples: list[Sample], cache: bool = True):
    model = tiny.tiny_target_model(0, scale=4.0)
    dcfg = make_drafter_config(cfg, model, MASK_ID)
    target = Target(model, dcfg.target_layer_ids)
    features = FeatureSource(target, samples, cfg.out / "features" if cache else None, chunk=cfg.chunk_sequences)
    features.prepare()
    drafter = init_drafter(dcfg, model, cfg.seed)
    return model, target, features, drafter, Trainer(cfg, drafter, target.lm_head, features, samples,
                                                     _quiet(cfg.steps))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Greedy continuations of random prompts by the tiny target (its own outputs, as in DeepSpec)."""
    model = tiny.tiny_target_model(0, scale=4.0)
    return _greedy_samples(model, 200, 8, 64, tmp_path_factory.mktemp("gen") / "continuations.jsonl")


# ---------------------------------------------------------------- train / serve consistency


@pytest.mark.parametrize("layout", ["deepspec", "dflash", "gemma4"])
def test_train_forward_equals_reference_forward_per_anchor(layout):
    """Every block of the batched masked forward equals Drafter.reference_forward at its anchor."""
    target = tiny.tiny_target()
    makers = {"deepspec": tiny.dspark_drafter, "dflash": lambda: tiny.dflash_drafter(target),
              "gemma4": tiny.gemma_drafter}
    drafter = makers[layout]()
    cfg = drafter.config
    width = 24
    taps = mx.random.normal((2, width, cfg.num_taps * cfg.hidden_size), key=mx.random.key(1))  # [b, W, m*d]
    anchors = np.array([[1, 6, 13], [2, 9, 23]])
    first = np.random.default_rng(0).integers(0, 200, size=anchors.size)
    blocks = np.full((anchors.size, cfg.block_size), cfg.mask_token_id)
    blocks[:, 0] = first
    h = train_backbone(drafter, taps, mx.array(blocks), mx.array(anchors.reshape(-1)),
                       mx.array(attention_mask(anchors, width, cfg.block_size)))  # [b*N, Bs, d]
    for row, a in enumerate(anchors.reshape(-1)):
        seq = row // anchors.shape[1]
        ref = drafter.reference_forward(taps[seq : seq + 1, :a], mx.array(blocks[row][None]))[0]  # [Bs, d]
        assert mx.allclose(h[row], ref, atol=2e-5).item(), (layout, row, a)


def test_batch_labels_markov_ids_and_masks_follow_the_slot_convention():
    """Labels are x_{a+k}, Markov ids x_{a+k-1}, target rows a+k-1, and validity is a contiguous prefix."""
    ids = np.arange(100, 112)
    mask = np.array([0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1], dtype=bool)
    sample = Sample(ids, mask)
    assert valid_anchors(sample).tolist() == [2, 3, 4, 5, 6, 9, 10]
    taps, hidden = mx.zeros((1, 12, 4)), mx.zeros((1, 12, 2))
    batch = build_batch([sample], taps, hidden, np.array([[5]]), block_slots=4, slot_offset=0,
                        mask_token_id=MASK_ID, decay=4.0)
    assert batch.block_ids.tolist() == [[105, MASK_ID, MASK_ID, MASK_ID]]
    # a=5: labels at 6, 7 valid; 8 is outside the loss mask, so 9 no longer counts either.
    assert batch.labels.tolist() == [106, 107] and batch.prev_ids.tolist() == [105, 106]
    assert batch.target_rows.tolist() == [5, 6] and batch.rows.tolist() == [0, 1]
    assert np.allclose(np.array(batch.weights), np.exp(-np.arange(2) / 4.0))
    zlab = build_batch([sample], taps, hidden, np.array([[5]]), block_slots=5, slot_offset=1,
                       mask_token_id=MASK_ID, decay=4.0)
    assert zlab.labels.tolist() == [106, 107] and zlab.num_drafts == 4  # slot 1 drafts p + 1


def test_attention_mask_sees_context_before_anchor_and_own_block_only():
    """Row (n, j) attends to context s < anchor_n and to block n, never to other blocks."""
    mask = attention_mask(np.array([[2, 5]]), width=6, block_slots=3)[0, 0]  # [N*Bs, W + N*Bs]
    assert mask.shape == (6, 12)
    assert mask[0, :6].tolist() == [True, True, False, False, False, False]
    assert mask[4, :6].tolist() == [True] * 5 + [False]
    assert mask[0, 6:].tolist() == [True] * 3 + [False] * 3 and mask[5, 6:].tolist() == [False] * 3 + [True] * 3


def test_anchor_sampling_is_seeded_and_repeats_only_when_short():
    """Anchors are distinct when enough valid positions exist, and reproducible from the seed."""
    sample = Sample(np.arange(40), np.ones(40, dtype=bool))
    a = sample_anchors(sample, 8, np.random.default_rng(1))
    assert len(set(a.tolist())) == 8 and a.tolist() == sorted(a.tolist())
    assert a.tolist() == sample_anchors(sample, 8, np.random.default_rng(1)).tolist()
    short = sample_anchors(Sample(np.arange(4), np.ones(4, dtype=bool)), 5, np.random.default_rng(0))
    assert set(short.tolist()) == {1, 2}


def test_losses_match_their_formulas():
    """CE, TV, c* = sum min(q, p) and the BCE follow spec Eq. 8-12 with position weights."""
    target = tiny.tiny_target()
    drafter = tiny.dspark_drafter()
    sample = Sample(np.random.default_rng(0).integers(0, 240, 20), np.ones(20, dtype=bool))
    hidden, taps = target.forward_hidden(mx.array(sample.ids[None]))
    batch = build_batch([sample], taps, hidden, np.array([[3, 9]]), block_slots=4, slot_offset=0,
                        mask_token_id=MASK_ID, decay=4.0)
    h = draft_rows(drafter, train_backbone(drafter, taps, batch.block_ids, batch.anchors, batch.attn_mask),
                   batch.rows)
    total, parts = block_losses(drafter, target.lm_head, h, batch, (0.1, 0.9, 1.0), True)
    logits = np.array(drafter.base_logits(h) + drafter.markov_bias(batch.prev_ids), dtype=np.float64)
    q = np.exp(logits - logits.max(1, keepdims=True))
    q /= q.sum(1, keepdims=True)
    tl = np.array(target.lm_head(hidden[0][batch.target_rows]), dtype=np.float64)
    p = np.exp(tl - tl.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    w = np.array(batch.weights, dtype=np.float64)
    ce = -np.log(q[np.arange(len(q)), np.array(batch.labels)])
    cstar = np.minimum(q, p).sum(1)
    z = np.array(drafter.confidence_logits(h, batch.prev_ids), dtype=np.float64)
    bce = np.logaddexp(0, z) - cstar * z
    expect = {"ce": (w * ce).sum() / w.sum(), "tv": (w * np.abs(q - p).sum(1)).sum() / w.sum(),
              "conf": (w * bce).sum() / w.sum()}
    for key, value in expect.items():
        assert abs(parts[key].item() - value) < 1e-4 * max(1.0, abs(value)), key
    assert np.allclose(np.array(parts["cstar"]), cstar, atol=1e-5)
    assert abs(total.item() - (0.1 * expect["ce"] + 0.9 * expect["tv"] + expect["conf"])) < 1e-3


def test_acceptance_estimate_is_one_plus_sum_of_prefix_products():
    """tau estimate = mean over blocks of 1 + sum_j prod_{i<=j} c*_i; missing rows count as rejected."""
    cstar = np.array([0.5, 0.5, 1.0, 0.2])
    per_pos, tau = acceptance_estimate(cstar, np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]), 2, 3)
    assert per_pos == [0.75, 0.35, 0.0]
    assert tau == pytest.approx(((1 + 0.5 + 0.25) + (1 + 1.0 + 0.2)) / 2)


# ---------------------------------------------------------------- learning, saving, resume


def test_tiny_drafter_learns_far_above_untrained_and_loads_unchanged(tmp_path, corpus):
    """A few hundred steps lift greedy tau (real SpecDecoder rounds) well above the untrained drafter's."""
    train, held = corpus[:-8], corpus[-8:]
    cfg = _config(tmp_path, steps=300, checkpoint_every=300, log_every=100)
    model, target, _, drafter, trainer = _setup(cfg, train)
    prompts = [s.ids[:32].tolist() for s in held]
    dcfg = drafter.config
    save_trained(drafter, dcfg, tmp_path / "untrained", "float32")
    before, _ = evaluate_saved(tmp_path / "untrained", target, model, prompts, 24)
    result = trainer.run()
    assert result.step == 300 and len(result.history) == 3
    save_trained(drafter, dcfg, tmp_path / "trained", "float16")
    after, rounds = evaluate_saved(tmp_path / "trained", target, model, prompts, 24)
    assert before.mean_accepted_length < 1.1 and before.acceptance_by_position[0] < 0.1
    # Typically 1.0 -> 1.5-1.9 here (the estimate on training batches reaches ~2.5).
    assert after.mean_accepted_length > before.mean_accepted_length + 0.3, (before.as_dict(), after.as_dict())
    assert after.acceptance_by_position[0] > 0.2
    assert result.history[-1]["greedy_tau_est"] > 1.8 and result.history[-1]["tau_est"] > result.history[0]["tau_est"]
    assert rounds and all(len(z) >= 1 for z, _, _ in rounds)  # confidence logits were recorded
    loaded, loaded_cfg = load_drafter(str(tmp_path / "trained"), target_vocab_size=256, target_num_layers=4,
                                      target_hidden_size=64)
    assert loaded_cfg == dcfg and not loaded.needs_target_binding
    ours = dict(tree_flatten(drafter.parameters()))
    for name, value in tree_flatten(loaded.parameters()):
        assert mx.allclose(value, ours[name].astype(mx.float16).astype(mx.float32)).item(), name


def test_interrupted_training_resumes_to_the_same_step_and_weights(tmp_path, corpus):
    """A run killed after 25 steps resumes from its step-20 checkpoint and ends like an uninterrupted run."""
    samples = corpus[:24]
    full = _config(tmp_path / "full")
    *_, drafter_a, trainer_a = _setup(full, samples, cache=False)
    assert trainer_a.run().step == 40
    part = _config(tmp_path / "part")
    *_, trainer_b = _setup(part, samples)
    with pytest.raises(TrainingStopped):
        trainer_b.run(stop_after=25)
    assert [p.name for p in checkpoint.list_checkpoints(part.out)] == ["step_0000010", "step_0000020"]
    *_, drafter_c, trainer_c = _setup(part, samples)
    result = trainer_c.run(resume=True)
    assert result.resumed_from == 20 and result.step == 40
    assert [e["step"] for e in result.history] == [10, 20, 30, 40]
    a, c = dict(tree_flatten(drafter_a.parameters())), dict(tree_flatten(drafter_c.parameters()))
    for name in a:
        assert mx.allclose(a[name], c[name], atol=1e-6).item(), name


def test_checkpoint_refuses_a_different_drafter(tmp_path, corpus):
    """Resuming with another geometry fails loudly instead of training a half-loaded drafter."""
    cfg = _config(tmp_path, steps=10)
    *_, trainer = _setup(cfg, corpus[:8], cache=False)
    trainer.run()
    *_, other = _setup(replace(cfg, markov_rank=8), corpus[:8], cache=False)
    with pytest.raises(checkpoint.CheckpointError):
        other.run(resume=True)


def test_tap_scale_trains_on_unit_rms_features_and_folds_into_a_plain_fc(tmp_path, corpus):
    """With a massive tap feature, fc trains on unit-RMS inputs; the saved fc (weight * scale) is plain."""
    cfg = _config(tmp_path, steps=5, checkpoint_every=5, log_every=5)
    model, target, features, drafter, trainer = _setup(cfg, corpus[:16])
    width = drafter.config.num_taps * drafter.config.hidden_size
    boost = mx.ones((width,)).at[3].multiply(1000.0)  # one "massive activation" feature

    def boosted(idx):
        taps, hidden = features.batch(idx)
        return taps * boost, hidden

    scale = precondition.apply(drafter, "rms", boosted, 8)
    assert isinstance(drafter.fc, precondition.ScaledLinear)
    scaled_rms = precondition.feature_rms(lambda idx: (boosted(idx)[0] * scale, None), 8)
    assert mx.allclose(scaled_rms, mx.ones_like(scaled_rms), rtol=1e-3).item()
    assert float(scale[3]) < float(mx.median(scale)) / 300
    names = {k for k, _ in tree_flatten(drafter.trainable_parameters())}
    assert "fc.weight" in names and "fc.scale" not in names  # checkpoints keep their keys

    trainer.run()  # the weight moves away from its initialisation
    taps, _ = boosted([0])
    ours = drafter.project_context(taps)  # [1, W, d]
    with precondition.folded(drafter):
        assert type(drafter.fc).__name__ == "Linear"
        assert mx.allclose(drafter.project_context(taps), ours, atol=1e-4).item()
        save_trained(drafter, drafter.config, tmp_path / "saved", "float32")
    assert isinstance(drafter.fc, precondition.ScaledLinear)
    loaded, _ = load_drafter(str(tmp_path / "saved"), target_vocab_size=256, target_num_layers=4)
    assert mx.allclose(loaded.project_context(taps), ours, atol=1e-4).item()
    plain = init_drafter(drafter.config, model, cfg.seed)
    assert precondition.apply(plain, "none", boosted, 8) is None and type(plain.fc).__name__ == "Linear"


# ---------------------------------------------------------------- features and generation


def test_feature_cache_is_exact_resumable_and_fingerprinted(tmp_path, corpus):
    """Cached features equal on-the-fly ones; only missing chunks are recomputed; stale caches are refused."""
    samples = corpus[:20]
    target = Target(tiny.tiny_target_model(0, scale=4.0), (0, 1))
    cached = FeatureSource(target, samples, tmp_path / "f", chunk=8)
    assert cached.prepare() == 3
    (tmp_path / "f" / "chunk_00001.safetensors").unlink()
    assert cached.prepare() == 1
    live = FeatureSource(target, samples)
    for got, want in zip(cached.batch([3, 17]), live.batch([3, 17])):
        assert got.shape == want.shape and mx.allclose(got, want, atol=1e-5).item()
    with pytest.raises(FeatureCacheError):
        FeatureSource(target, samples[:10], tmp_path / "f", chunk=8).prepare()


def test_forward_hidden_maps_to_the_target_logits():
    """lm_head(final hidden) reproduces the target's logits, so the cache may store hidden states."""
    target = tiny.tiny_target()
    ids = mx.array([[5, 6, 7, 8, 9]])
    hidden, taps = target.forward_hidden(ids)
    logits, taps2 = target.forward(ids, target.make_cache())
    assert mx.allclose(target.lm_head(hidden), logits, atol=1e-4).item()
    assert mx.array_equal(taps, taps2).item()


def test_continuations_are_batched_greedy_and_resumable(tmp_path, monkeypatch):
    """Batched greedy continuations equal plain greedy decoding, and a restart reuses finished ones."""
    model = tiny.tiny_target_model(0, scale=4.0)
    prompts = [[1, 2, 3], [40, 41, 42, 43, 44], [7]]
    cache = tmp_path / "c.jsonl"
    answers = generate_continuations(model, prompts, 6, cache, batch=2)
    for prompt, answer in zip(prompts, answers):
        ids = list(prompt)
        for _ in range(6):
            ids.append(mx.argmax(model(mx.array([ids]))[0, -1]).item())
        assert answer == ids[len(prompt) :]
    import engine.train.generate as gen

    monkeypatch.setattr(gen, "generate_batch", lambda *a, **k: pytest.fail("regenerated a finished prompt"))
    assert generate_continuations(model, prompts, 6, cache, batch=2) == answers


# ---------------------------------------------------------------- data and config


def test_text_chunks_and_chat_answer_masks():
    """Text trains on every token; chat trains on the answer only, cut to seq_len keeping the answer."""
    chunks = chunk_ids(list(range(25)), 10, 4)
    assert [len(c) for c in chunks] == [10, 10, 5] and all(c.loss_mask.all() for c in chunks)
    assert len(chunk_ids(list(range(23)), 10, 4)) == 2
    tok = ByteTokenizer()
    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    prompt = record_prompt(record, tok)
    assert prompt.ids == [241, *tok.encode("hi"), 243, 242] and prompt.answer == [*tok.encode("yo"), 243]
    assert record_prompt({"text": "ab"}, tok).ids == tok.encode("ab")
    sample = answer_sample(list(range(50)), [7, 8, 9], seq_len=20)
    assert len(sample) == 20 and sample.loss_mask.tolist() == [False] * 17 + [True] * 3


def test_text_directories_are_listed_with_excludes(tmp_path):
    """Directories contribute their text files, minus path parts matching an exclude glob."""
    for rel in ("a.py", "doc/b.rst", "test/c.py", "pkg/test_d.py", "e.bin"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    names = [p.relative_to(tmp_path).as_posix() for p in list_text_files([tmp_path], ("test", "test_*"))]
    assert names == ["a.py", "doc/b.rst"]
    with pytest.raises(FileNotFoundError):
        list_text_files([tmp_path / "missing"])


def test_default_mask_token_is_an_unused_special_token():
    """The mask id is the highest special token that is not bos/eos/pad/unk, else the last id."""

    class Tok:
        all_special_ids = [0, 1, 2, 5, 9]
        bos_token_id, eos_token_id, pad_token_id, unk_token_id = 1, 2, 2, 0

    assert default_mask_token_id(Tok(), 100) == 9
    assert default_mask_token_id(ByteTokenizer(), 256) == 255


@pytest.mark.parametrize("variant, layout, drafts_slots", [("dspark", "deepspec", 4), ("dspark", "compact", 4),
                                                           ("dflash", "zlab", 5), ("dflash", "deepspec", 4)])
def test_drafter_config_layouts_round_trip_with_the_same_number_of_drafts(tmp_path, variant, layout, drafts_slots):
    """Every save layout normalizes back to itself, and drafts block_size tokens per round."""
    cfg = _config(tmp_path, variant=variant, layout=layout)
    dcfg = make_drafter_config(cfg, tiny.tiny_target_model(0), MASK_ID)
    assert dcfg.block_size == drafts_slots and dcfg.max_drafts == 4
    assert (dcfg.markov_rank > 0) == (variant == "dspark") == dcfg.enable_confidence_head
    again = normalize_drafter_config(drafter_config_to_raw(dcfg))
    assert again == replace(dcfg, owns_embeddings=again.owns_embeddings)
    assert again.owns_embeddings == (layout == "deepspec")


def test_zlab_layout_is_only_for_dflash(tmp_path):
    """A zlab checkpoint has no heads, so a DSpark drafter cannot be saved in it."""
    with pytest.raises(ValueError):
        _config(tmp_path, variant="dspark", layout="zlab")


# ---------------------------------------------------------------- STS


def _synthetic_rounds(scale: float, num: int = 4000, drafts: int = 4, seed: int = 0) -> sts.Rounds:
    """Rounds whose true conditional acceptance is sigmoid(z), reported as scale * z (miscalibrated)."""
    rng = np.random.default_rng(seed)
    true_z = rng.normal(0.5, 1.5, size=(num, drafts))
    accepted_each = rng.random((num, drafts)) < 1 / (1 + np.exp(-true_z))
    accepted = np.cumprod(accepted_each, axis=1).sum(axis=1)
    return sts.Rounds(scale * true_z, accepted, np.arange(num) % 7)


def test_sts_lowers_ece_of_overconfident_heads():
    """On confidences 3x too sharp, STS finds t ~ 3 and cuts the per-position ECE."""
    rounds = _synthetic_rounds(3.0)
    report = sts.calibrate(rounds)
    assert all(a <= b for a, b in zip(report["ece_after"], report["ece_before"]))
    assert report["ece_before"][0] > 0.05 and max(report["ece_after"]) < 0.03
    assert 2.0 < report["temperatures"][0] < 4.5
    assert max(report["ece_after_crossfit"]) < 0.04


def test_sts_leaves_calibrated_heads_nearly_alone_and_handles_unverified_positions():
    """Calibrated inputs keep t near 1; positions verified fewer than MIN_SAMPLES times keep t = 1."""
    rounds = _synthetic_rounds(1.0, num=20000)
    rounds.z[10:, 3] = np.nan
    report = sts.calibrate(rounds)
    assert all(0.7 < t < 1.5 for t in report["temperatures"][:3]) and report["temperatures"][3] == 1.0
    assert report["samples_by_position"][3] == 10 and max(report["ece_after"][:3]) < 0.02
    assert sts.ece(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.0


# ---------------------------------------------------------------- pipeline and CLI


def _write_text(path: Path) -> Path:
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "range", "print"]
    path.write_text("\n".join(" ".join(rng.choice(words, 8)) for _ in range(120)))
    return path


def test_pipeline_trains_saves_evaluates_and_calibrates(tmp_path, context_spy):
    """The whole run on text writes a loadable drafter with STS temperatures and a training.json."""
    data = DataConfig(text=(str(_write_text(tmp_path / "corpus.txt")),), heldout=2, num_eval_prompts=2)
    cfg = _config(tmp_path / "run", steps=12, checkpoint_every=6, log_every=6, seq_len=96, eval_max_tokens=12)
    model = tiny.tiny_target_model(0, scale=4.0)
    report = run_with_model(cfg, data, model, ByteTokenizer(), "tiny", bar=_quiet(12))
    raw = json.loads((cfg.out / "config.json").read_text())
    assert len(raw["sts_temperatures"]) == 4 and raw["architectures"] == ["Qwen3DSparkModel"]
    drafter, dcfg = load_drafter(str(cfg.out), target_vocab_size=256, target_num_layers=4)
    assert dcfg.sts_temperatures == tuple(raw["sts_temperatures"])
    saved = json.loads((cfg.out / "training.json").read_text())
    assert saved["train"]["steps"] == 12 and len(saved["history"]) == 2 and saved["train"]["tap_scale"] == "rms"
    assert {"estimate", "greedy", "sts"} <= set(saved["heldout"]) and saved["heldout"]["greedy"]["rounds"] > 0
    estimate = saved["heldout"]["estimate"]
    assert 1.0 <= estimate["greedy_tau_estimate_zero_context"] <= 1.0 + dcfg.max_drafts
    assert len(estimate["greedy_acceptance_by_position_zero_context"]) == dcfg.max_drafts
    assert True in context_spy and False in context_spy  # the zero-context estimate ran on zero rows
    assert report["data"]["heldout_samples"] == 2 and list((cfg.out / "features").glob("chunk_*.safetensors"))
    with pytest.raises(OutputDirError):
        run_with_model(cfg, data, tiny.tiny_target_model(0), ByteTokenizer(), "tiny", bar=_quiet(12))


def test_pipeline_pauses_with_a_checkpoint_and_resumes_to_the_end(tmp_path):
    """stop_after checkpoints and stops the run; resume reuses samples and features and finishes it."""
    data = DataConfig(text=(str(_write_text(tmp_path / "corpus.txt")),), heldout=2, num_eval_prompts=1)
    cfg = _config(tmp_path / "run", steps=8, checkpoint_every=100, log_every=4, seq_len=96, eval_max_tokens=8)
    with pytest.raises(TrainingStopped):
        run_with_model(cfg, data, tiny.tiny_target_model(0), ByteTokenizer(), "tiny", stop_after=3, bar=_quiet(8))
    assert [p.name for p in checkpoint.list_checkpoints(cfg.out)] == ["step_0000003"]
    report = run_with_model(cfg, data, tiny.tiny_target_model(0), ByteTokenizer(), "tiny", resume=True,
                            bar=_quiet(8))
    assert report["train"]["resumed_from"] == 3 and report["train"]["steps"] == 8
    assert report["wall_s"]["features_s"] < 5.0 and (cfg.out / "config.json").exists()


def test_pipeline_dflash_variant_saves_a_zlab_checkpoint_with_the_same_drafts(tmp_path):
    """--variant dflash trains CE only and saves a z-lab drafter that binds the target and drafts B tokens."""
    data = DataConfig(text=(str(_write_text(tmp_path / "corpus.txt")),), heldout=2, num_eval_prompts=1)
    cfg = _config(tmp_path / "run", variant="dflash", steps=6, log_every=3, seq_len=96, eval_max_tokens=8,
                  feature_cache=False)
    report = run_with_model(cfg, data, tiny.tiny_target_model(0), ByteTokenizer(), "tiny", bar=_quiet(6))
    drafter, dcfg = load_drafter(str(cfg.out), target_vocab_size=256, target_num_layers=4)
    assert dcfg.layout == "dflash" and dcfg.block_size == 5 and dcfg.max_drafts == 4
    assert drafter.needs_target_binding and not drafter.has_markov and not drafter.has_confidence
    assert report["history"][-1]["tv"] is not None and "sts" not in report["heldout"]


def test_cli_registers_train_drafter_and_maps_flags(tmp_path):
    """`dspark train-drafter` parses its flags into the trainer's configs."""
    from dspark_cli.main import build_parser
    from dspark_cli.train import configs

    args = build_parser().parse_args(["train-drafter", "--data", "docs", "--out", str(tmp_path), "--variant",
                                      "dflash", "--block-size", "5", "--taps", "1,14,27", "--steps", "30",
                                      "--anchors", "8", "--resume", "--generate-continuations", "64",
                                      "--exclude", "test", "--tap-scale", "none"])
    cfg, data = configs(args)
    assert cfg.variant == "dflash" and cfg.resolved_layout == "zlab" and cfg.block_size == 5
    assert cfg.tap_scale == "none" and configs(build_parser().parse_args(
        ["train-drafter", "--data", "docs", "--out", str(tmp_path)]))[0].tap_scale == "rms"
    assert cfg.taps == (1, 14, 27) and cfg.steps == 30 and cfg.anchors == 8 and args.resume
    assert data.text == ("docs",) and data.continuations == 64 and data.exclude == ("test",)


def test_log_averages_each_loss_part_over_the_steps_that_computed_it():
    """DFlash computes tv only on logging steps: the logged tv is that value, not diluted by the others."""
    from types import SimpleNamespace

    from engine.train.loop import _Meter

    meter, batch = _Meter(), SimpleNamespace(rows=mx.zeros(4))
    for step in range(3):
        parts = {"ce": mx.array(2.0 + step)} | ({"tv": mx.array(1.5)} if step == 2 else {})
        meter.add(batch, parts, 0.1)
    entry = meter.entry(3, 1e-3, 0.3)
    assert entry["ce"] == pytest.approx(3.0) and entry["tv"] == pytest.approx(1.5) and entry["conf"] is None
