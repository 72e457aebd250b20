"""Drafter recipe v2 (issue 18): target top-k cache, distillation + hidden regression losses, the
phase schedule (Markov head frozen early), instruments and the go/no-go gate, held-out text."""

from __future__ import annotations

import io
import json
from pathlib import Path

import engine  # noqa: F401  (loads the fast BLAS; must come before mlx.core)

# isort: split
import mlx.core as mx
import numpy as np
import pytest

from engine.models.target import Target
from engine.train import data as D
from engine.train.batch import Teacher, build_batch, gather_teacher
from engine.train.config import TrainConfig, make_drafter_config
from engine.train.features import FeatureSource
from engine.train.forward import draft_rows, train_backbone
from engine.train.instruments import GateFailed, Monitor
from engine.train.loop import Trainer
from engine.train.loss import cosine_rows, kd_losses, kd_rows
from engine.train.model import init_drafter
from engine.train.pipeline import DataConfig, run_with_model
from engine.train.progress import ProgressBar
from engine.train.recipe import phase_at
from tests.engine import tiny
from tests.engine.test_train import MASK_ID, ByteTokenizer, _greedy_samples

K = 8


def _teacher_from(logits: mx.array, labels: mx.array, k: int = K) -> Teacher:
    """The Teacher a cache would hold for a target whose logits are ``logits`` [R, V]."""
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    ids = mx.argsort(-logp, axis=-1)[:, :k].astype(mx.int32)
    label_logp = mx.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
    return Teacher(ids, mx.take_along_axis(logp, ids, axis=-1), label_logp)


def _logz(logits: mx.array) -> mx.array:
    return mx.logsumexp(logits, axis=-1, keepdims=True)


# ---------------------------------------------------------------- losses


def test_kd_is_zero_when_the_drafter_equals_the_target_and_positive_otherwise():
    """KL over {top-k, label, rest} vanishes at q = p, labels inside or outside the top-k."""
    logits = mx.random.normal((6, 40), key=mx.random.key(0)) * 3  # [R, V]
    teacher_top = mx.argsort(-logits, axis=-1)
    labels = mx.concatenate([teacher_top[:3, 0], teacher_top[3:, 30]]).astype(mx.int32)  # in and out of top-k
    teacher = _teacher_from(logits, labels)
    same = kd_rows(logits, _logz(logits), labels, teacher)
    assert mx.abs(same).max().item() < 1e-5
    other = logits + mx.random.normal(logits.shape, key=mx.random.key(1))
    assert (kd_rows(other, _logz(other), labels, teacher) > 1e-3).all().item()


def test_kd_equals_the_bucketed_kl_computed_by_hand():
    """Buckets: the top-k, the label when outside it, and the rest of the vocabulary."""
    rng = np.random.default_rng(0)
    t, d = rng.normal(size=(1, 12)) * 2, rng.normal(size=(1, 12)) * 2
    p, q = np.exp(t) / np.exp(t).sum(), np.exp(d) / np.exp(d).sum()
    top = np.argsort(-p[0])[:3]
    label = int(np.argsort(-p[0])[7])
    buckets = [[i] for i in top] + [[label]] + [[i for i in range(12) if i not in set(top) | {label}]]
    pb = np.array([p[0, b].sum() for b in buckets])
    qb = np.array([q[0, b].sum() for b in buckets])
    expect = float((pb * np.log(pb / qb)).sum())
    logits = mx.array(d.astype(np.float32))
    got = kd_rows(logits, _logz(logits), mx.array([label]), _teacher_from(mx.array(t.astype(np.float32)),
                                                                          mx.array([label]), 3))
    assert got.item() == pytest.approx(expect, rel=1e-4, abs=1e-6)


def test_kd_gradient_reaches_the_logits():
    """The gradient lifts the target's top token in the drafter (and is zero at q = p)."""
    target = mx.array([[4.0, 1.0, 0.0, -1.0, 0.5]])
    labels = mx.array([0])
    teacher = _teacher_from(target, labels, 2)

    def loss(z):
        return kd_rows(z, _logz(z), labels, teacher).sum()

    g = mx.grad(loss)(mx.zeros((1, 5)))
    assert g[0, 0].item() < 0 and mx.abs(g).sum().item() > 0.1
    assert mx.abs(mx.grad(loss)(target)).max().item() < 1e-5


def test_cosine_regression_is_zero_on_equal_states_and_has_a_gradient():
    """1 - cos is 0 for equal (or positively scaled) rows, > 0 otherwise, and trains h."""
    h = mx.random.normal((5, 16), key=mx.random.key(2))
    assert mx.abs(cosine_rows(h, h * 3.0)).max().item() < 1e-6
    other = mx.random.normal((5, 16), key=mx.random.key(3))
    assert (cosine_rows(h, other) > 1e-3).all().item()
    g = mx.grad(lambda x: cosine_rows(x, other).sum())(h)
    assert mx.abs(g).sum().item() > 0


def _kd_batch(samples, target, drafter, anchors):
    hidden, taps = target.forward_hidden(mx.array(np.stack([s.ids for s in samples])))
    cfg = drafter.config
    return build_batch(samples, taps, hidden, anchors, block_slots=cfg.block_size, slot_offset=cfg.draft_slot_offset,
                       mask_token_id=MASK_ID, decay=4.0)


def test_kd_losses_vanish_when_teacher_and_hidden_are_the_drafters_own():
    """Through the real drafter: both terms are ~0 when the target is the drafter itself, and > 0
    against the real target; the sink row (target position 0) is left out of the regression."""
    target, drafter = tiny.tiny_target(), tiny.dspark_drafter()
    rng = np.random.default_rng(0)
    samples = [D.Sample(rng.integers(0, 240, 24), np.ones(24, dtype=bool)) for _ in range(2)]
    batch = _kd_batch(samples, target, drafter, np.array([[2, 9], [4, 15]]))
    h_rows = draft_rows(drafter, train_backbone(drafter, batch.taps, batch.block_ids, batch.anchors,
                                                batch.attn_mask), batch.rows)
    from engine.models.drafter import draft_logits

    own = _teacher_from(draft_logits(drafter, h_rows, batch.prev_ids), batch.labels)
    flat = mx.zeros((batch.hidden.shape[0] * batch.hidden.shape[1], batch.hidden.shape[2]))
    flat[batch.target_rows] = h_rows
    mirror = build_batch(samples, batch.taps, flat.reshape(batch.hidden.shape), np.array([[2, 9], [4, 15]]),
                         block_slots=drafter.config.block_size, slot_offset=0, mask_token_id=MASK_ID, decay=4.0)
    _, parts = kd_losses(drafter, h_rows, mirror, own, {"kd": 1.0, "hidden": 0.5})
    assert abs(parts["kd"].item()) < 1e-4 and abs(parts["hidden"].item()) < 1e-5
    real = _teacher_from(target.lm_head(batch.hidden.reshape(-1, batch.hidden.shape[-1])[batch.target_rows]),
                         batch.labels)
    _, parts = kd_losses(drafter, h_rows, batch, real, {"kd": 1.0, "hidden": 0.5})
    assert parts["kd"].item() > 1e-3 and parts["hidden"].item() > 1e-3


# ---------------------------------------------------------------- cache and batches


def test_feature_cache_keeps_the_targets_topk_and_next_token_logprob(tmp_path):
    """Cached top-k equals the head's sorted log-probs; next_logprob is log p(x_{t+1}); fingerprinted on k."""
    model = tiny.tiny_target_model(0, scale=4.0)
    target = Target(model, (0, 1))
    rng = np.random.default_rng(1)
    samples = [D.Sample(rng.integers(0, 240, n), np.ones(n, dtype=bool)) for n in (20, 13, 17)]
    cached = FeatureSource(target, samples, tmp_path / "f", chunk=2, topk=K)
    assert cached.prepare() == 2 and cached.complete_chunks() == 2
    ids, logp, nxt = cached.teacher([0, 1])  # [b, W, k], [b, W, k], [b, W]
    fly = FeatureSource(target, samples, None, topk=K).teacher([0, 1])
    assert mx.array_equal(ids, fly[0]).item() and mx.allclose(logp, fly[1], atol=1e-5).item()
    hidden, _ = target.forward_hidden(mx.array(samples[0].ids[None]))
    full = target.lm_head(hidden[0])
    full = full - mx.logsumexp(full, axis=-1, keepdims=True)  # [S, V]
    assert mx.array_equal(ids[0, :20, 0], mx.argmax(full, axis=-1)).item()
    assert mx.allclose(logp[0, :20], mx.sort(full, axis=-1)[:, ::-1][:, :K], atol=1e-4).item()
    follow = mx.take_along_axis(full[:-1], mx.array(samples[0].ids[1:])[:, None], axis=-1)[:, 0]
    assert mx.allclose(nxt[0, :19], follow, atol=1e-4).item()
    with pytest.raises(Exception, match="other data"):
        FeatureSource(target, samples, tmp_path / "f", chunk=2, topk=4).prepare()


def test_position_cap_keeps_only_early_drafts_and_teacher_rows_follow_labels():
    """max_position drops later draft rows; the gathered teacher's label log-prob is the label's."""
    sample = D.Sample(np.arange(100, 120), np.ones(20, dtype=bool))
    taps, hidden = mx.zeros((1, 20, 4)), mx.zeros((1, 20, 2))
    batch = build_batch([sample], taps, hidden, np.array([[3, 8]]), block_slots=4, slot_offset=0,
                        mask_token_id=MASK_ID, decay=4.0, max_position=2)
    assert batch.position.tolist() == [0, 1, 0, 1] and batch.labels.tolist() == [104, 105, 109, 110]
    nxt = mx.arange(20, dtype=mx.float32)[None] * -0.1  # [1, W]: row t holds "log p(x_{t+1})" = -t/10
    teacher = gather_teacher(mx.zeros((1, 20, 3), dtype=mx.int32), mx.zeros((1, 20, 3)), nxt, batch.target_rows)
    assert np.allclose(np.array(teacher.label_logp), [-0.3, -0.4, -0.8, -0.9])


# ---------------------------------------------------------------- recipe, instruments, gate


def _v2_config(out: Path, **kw) -> TrainConfig:
    base = dict(out=out, num_layers=1, block_size=4, markov_rank=16, taps=(0, 1), steps=40, batch=4, anchors=16,
                lr=3e-3, seq_len=128, checkpoint_every=10, log_every=10, chunk_sequences=8, eval_max_tokens=16,
                mask_token_id=MASK_ID, objective="kd", topk=K, weight_decay=0.05, beta2=0.95, min_lr_frac=0.1,
                regress_steps=4, early_steps=16, final_steps=6, markov_lr_mult=0.3, instrument_every=10)
    return TrainConfig(**(base | kw))


def test_phase_schedule_of_the_v2_recipe():
    """regress -> early (positions <= 2, Markov frozen) -> full (Markov at lr x mult) -> final (+TV, conf)."""
    cfg = _v2_config(Path("."))
    names = [phase_at(cfg, s).name for s in (0, 3, 4, 15, 16, 33, 34, 39)]
    assert names == ["regress", "regress", "early", "early", "full", "full", "final", "final"]
    assert phase_at(cfg, 0).weights["kd"] == 0 and phase_at(cfg, 5).max_position == 2
    assert phase_at(cfg, 5).markov_mult == 0 and phase_at(cfg, 20).markov_mult == 0.3
    assert phase_at(cfg, 39).weights["tv"] == 0.5 and phase_at(cfg, 20).max_position is None
    old = TrainConfig(out=Path("."))
    assert phase_at(old, 0).name == "ce_tv" and phase_at(old, 0).weights == {"ce": 0.1, "tv": 0.9, "conf": 1.0}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    model = tiny.tiny_target_model(0, scale=4.0)
    return _greedy_samples(model, 120, 8, 48, tmp_path_factory.mktemp("gen") / "continuations.jsonl")


def _trainer(cfg, train, held):
    model = tiny.tiny_target_model(0, scale=4.0)
    dcfg = make_drafter_config(cfg, model, MASK_ID)
    target = Target(model, dcfg.target_layer_ids)
    features = FeatureSource(target, train, cfg.out / "features", chunk=cfg.chunk_sequences, topk=cfg.topk)
    features.prepare()
    held_features = FeatureSource(target, held, None, topk=cfg.topk)
    drafter = init_drafter(dcfg, model, cfg.seed)
    trainer = Trainer(cfg, drafter, target.lm_head, features, train, ProgressBar(cfg.steps, io.StringIO(), tty=False))
    trainer.monitor = Monitor(held, held_features, cfg.instrument_every, cfg.seed)
    return trainer


def test_v2_training_freezes_markov_early_learns_and_reports_instruments(tmp_path, corpus):
    """The Markov bias stays exactly zero through the early phases, then trains; the held-out greedy
    match at position 1 rises; instruments log residual norms, anchor swap and zero-context match."""
    cfg = _v2_config(tmp_path, steps=120, regress_steps=10, early_steps=60, final_steps=10, instrument_every=20,
                     checkpoint_every=60)
    trainer = _trainer(cfg, corpus[:-8], corpus[-8:])
    before = trainer.monitor.measure(trainer, 0)["greedy_match"]["by_position"][0]
    trainer.cfg = cfg.__class__(**{**cfg.__dict__, "steps": 60})  # stop at the end of the early phase
    trainer.run()
    w2 = trainer.drafter.markov_head.markov_w2.weight
    assert mx.abs(w2).max().item() == 0.0
    trainer.cfg = cfg
    result = trainer.run(resume=True)
    assert mx.abs(trainer.drafter.markov_head.markov_w2.weight).max().item() > 0
    last = result.instruments[-1]
    assert len(last["residual_norm"]) == 2 and set(last["anchor_swap"]) == {"mean_abs_logit_delta", "tv"}
    assert all(0 <= share <= 1 for share in last["residual_constant_share"])
    assert len(last["greedy_match_zero_context"]["by_position"]) == 4
    assert last["greedy_match"]["by_position"][0] > before + 0.2, (before, last)
    phases = {e["phase"] for e in result.history}
    assert {"regress", "early", "full", "final"} <= phases and result.history[-1]["tv"] is not None


def test_gate_stops_the_run_and_writes_why_into_training_json(tmp_path):
    """A gate that cannot pass stops the run after the early phase with the numbers in training.json."""
    cfg = _v2_config(tmp_path, steps=30, regress_steps=2, early_steps=10, final_steps=4, gate_core_hours=100.0,
                     gate_min_match=1.01, checkpoint_every=10)
    data = DataConfig(text=(str(_write_text(tmp_path)),), heldout=2, eval_prompts=None)
    report = run_with_model(cfg, data, tiny.tiny_target_model(0), ByteTokenizer(), "tiny",
                            bar=ProgressBar(30, io.StringIO(), tty=False))
    saved = json.loads((tmp_path / "training.json").read_text())
    assert report["gate"]["passed"] is False and saved["gate"]["step"] == 10
    assert "gate failed at step 10" in saved["stopped"] and saved["gate"]["threshold"] == 1.01
    assert (tmp_path / "config.json").exists()  # the drafter at the gate is saved
    with pytest.raises(GateFailed):
        raise GateFailed(saved["gate"])


def _write_text(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "def", "return", "(x)", ":", "\n"]
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(rng.choice(words, 3000)))
    return path


# ---------------------------------------------------------------- data and CLI


def test_heldout_prompts_keep_their_files_and_passages_out_of_training(tmp_path):
    """A file quoting a held-out passage is dropped; held-out text samples are the passages."""
    passage = "def held(x):\n    return x + 1  # " + "padding words " * 10
    (tmp_path / "a.py").write_text("import os\n" + passage + "\n")
    (tmp_path / "b.py").write_text("print('kept')\n" * 20)
    record = {"messages": [{"role": "user", "content": f"Explain this:\n\n```python\n{passage}\n```"}]}
    files = [p for p in D.list_text_files([tmp_path]) if not D.heldout_by_path(p)]
    kept, _ = D.drop_heldout_files(files, D.heldout_passages([record]))
    assert [p.name for p in kept] == [p.name for p in files if p.name == "b.py"]
    held = D.passage_samples([record], ByteTokenizer(), 4, 512, 16)
    assert len(held) == 1 and bytes(held[0].ids.tolist()).decode() == passage


def test_cli_recipes_v1_reproduces_run_3_and_v2_is_the_default(tmp_path):
    """--recipe v1 gives the run-3 optimisation; v2 (default) the issue-18 recipe; explicit flags win."""
    from dspark_cli.main import build_parser
    from dspark_cli.train import configs

    def cfg_of(*extra):
        return configs(build_parser().parse_args(["train-drafter", "--data", "d", "--out", str(tmp_path),
                                                  "--steps", "1000", *extra]))[0]

    v1 = cfg_of("--recipe", "v1")
    assert (v1.objective, v1.batch, v1.anchors, v1.lr, v1.weight_decay, v1.beta2, v1.min_lr_frac) == \
        ("ce_tv", 2, 64, 6e-4, 0.0, 0.999, 0.0)
    assert v1.early_steps == 0 and v1.gate_core_hours == 0 and v1.topk == 0
    v2 = cfg_of("--lr", "1e-3")
    assert (v2.objective, v2.topk, v2.batch, v2.anchors, v2.lr, v2.weight_decay) == ("kd", 32, 8, 32, 1e-3, 0.05)
    assert (v2.early_steps, v2.final_steps, v2.regress_steps, v2.markov_lr_mult) == (600, 100, 100, 0.3)


def test_growing_order_widens_its_window_and_missing_chunks_are_computed_on_demand(tmp_path):
    """GrowingOrder is a pure function of (seed, step) within a widening window; a batch from a
    chunk nobody wrote yet computes it (equal to the prepared cache)."""
    from engine.train.order import GrowingOrder

    order = GrowingOrder(num=70, chunk=16, batch=4, seed=0, start=2, grow_every=10)
    assert [order.window(s) for s in (0, 9, 10, 25, 1000)] == [2, 2, 3, 4, 5]
    for step in (0, 9, 10, 31):
        idx = order.indices(step)
        assert idx == GrowingOrder(70, 16, 4, 0, 2, 10).indices(step) and len(set(idx)) == 4
        assert max(idx) // 16 < order.window(step) and len({i // 16 for i in idx}) == 1
    target = Target(tiny.tiny_target_model(0, scale=4.0), (0, 1))
    rng = np.random.default_rng(2)
    samples = [D.Sample(rng.integers(0, 240, 12), np.ones(12, dtype=bool)) for _ in range(6)]
    lazy = FeatureSource(target, samples, tmp_path / "lazy", chunk=2, topk=4)
    lazy.prepare(limit=1)
    assert lazy.complete_chunks() == 1
    taps, _ = lazy.batch([5])
    ids, _, _ = lazy.teacher([5])
    assert (tmp_path / "lazy" / "chunk_00002.safetensors").exists()
    full = FeatureSource(target, samples, None, topk=4)
    assert mx.allclose(taps, full.batch([5])[0], atol=1e-5).item() and mx.array_equal(ids, full.teacher([5])[0]).item()


def test_extract_only_fills_a_shared_cache_that_a_training_run_reuses(tmp_path):
    """--extract-only writes the cache and extract.json; a run on the same data and --features-dir
    finds every chunk there (computes none) and trains on the first --train-chunks chunks."""
    text = str(_write_text(tmp_path))
    data = DataConfig(text=(text,), heldout=0)
    shared = tmp_path / "features"
    cfg = _v2_config(tmp_path / "extract", features_dir=shared, seq_len=64, steps=4, regress_steps=1,
                     early_steps=2, final_steps=1, instrument_every=0)
    report = run_with_model(cfg, data, tiny.tiny_target_model(0), ByteTokenizer(), "tiny", extract_only=True,
                            bar=ProgressBar(4, io.StringIO(), tty=False))
    assert report["chunks"] >= 2 and json.loads((tmp_path / "extract" / "extract.json").read_text())["topk"] == K
    before = {p.name: p.stat().st_mtime_ns for p in shared.glob("chunk_*")}
    stream = io.StringIO()
    run_cfg = _v2_config(tmp_path / "run", features_dir=shared, seq_len=64, steps=4, regress_steps=1, early_steps=2,
                         final_steps=1, instrument_every=0, train_chunks=1, eval_max_tokens=4)
    out = run_with_model(run_cfg, data, tiny.tiny_target_model(0), ByteTokenizer(), "tiny",
                         bar=ProgressBar(4, stream, tty=False))
    assert {p.name: p.stat().st_mtime_ns for p in shared.glob("chunk_*")} == before
    assert out["data"]["train_samples"] == run_cfg.chunk_sequences and out["train"]["recipe"]["train_chunks"] == 1
    assert out["train"]["steps"] == 4 and "target features" not in stream.getvalue()


def test_v2_pipeline_runs_every_phase_then_evaluates_and_calibrates(tmp_path):
    """A kd run through the pipeline ends like a v1 run: saved drafter, held-out estimate, real
    rounds and STS, with the recipe, instruments and CPU time in training.json."""
    cfg = _v2_config(tmp_path, steps=12, regress_steps=2, early_steps=6, final_steps=3, instrument_every=6,
                     eval_max_tokens=8, checkpoint_every=6)
    data = DataConfig(text=(str(_write_text(tmp_path)),), heldout=2, num_eval_prompts=2)
    report = run_with_model(cfg, data, tiny.tiny_target_model(0), ByteTokenizer(), "tiny",
                            bar=ProgressBar(12, io.StringIO(), tty=False))
    assert report["train"]["steps"] == 12 and report["train"]["recipe"]["objective"] == "kd"
    assert [r["step"] for r in report["instruments"]] == [6, 12] and report["gate"] is None
    assert report["train"]["cpu_s"] > 0 and "tau" in report["heldout"]["greedy"]
    assert "greedy_tau_estimate" in report["heldout"]["estimate"] and "temperatures" in report["heldout"]["sts"]
