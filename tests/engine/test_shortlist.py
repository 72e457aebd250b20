"""The draft-vocabulary shortlist of the distillation loss (issue 18): `draft_logits` over a column
subset equals the whole-vocabulary logits at those columns (every head layout, Markov heads
included), the shortlist and a batch's columns are built as documented, the restricted KD is the
bucketed KL over those columns, and a kd run with a shortlist trains, records it and still scores
its instruments over the whole vocabulary."""

from __future__ import annotations

import io
import json

import engine  # noqa: F401  (loads the fast BLAS; must come before mlx.core)

# isort: split
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import qwen3

from engine.loading.drafter import load_drafter
from engine.models.drafter import draft_logits, quantize_drafter
from engine.train import data as D
from engine.train.batch import Teacher
from engine.train.forward import draft_rows, train_backbone
from engine.train.loop import TrainingStopped
from engine.train.loss import kd_losses, kd_rows
from engine.train.shortlist import batch_columns, frequent_tokens, label_coverage
from tests.engine import drafter_fixtures as fx
from tests.engine import tiny
from tests.engine.test_train_v2 import K, _kd_batch, _teacher_from, _trainer, _v2_config

VOCAB_SUBSET = mx.array([0, 3, 17, 42, 99, 128, 200, 255], dtype=mx.int32)  # [S] sorted token ids


def _rows(seed: int = 1, n: int = 5) -> tuple[mx.array, mx.array]:
    h = mx.random.normal((n, fx.HIDDEN), key=mx.random.key(seed))  # [n, d]
    prev = mx.array(np.random.default_rng(seed).integers(0, fx.VOCAB, n).astype(np.int32))  # [n]
    return h, prev


def _with_markov_bias(drafter):
    # Random W2: the bias starts at zero in training, so a zero W2 would test nothing.
    head = drafter.markov_head
    head.markov_w2.weight = mx.random.normal(head.markov_w2.weight.shape, key=mx.random.key(9))
    return drafter


def _tied_qwen3_target() -> nn.Module:
    args = qwen3.ModelArgs(model_type="qwen3", hidden_size=fx.HIDDEN, num_hidden_layers=fx.TARGET_LAYERS,
                           intermediate_size=fx.INTER, num_attention_heads=fx.HEADS, rms_norm_eps=1e-6,
                           vocab_size=fx.VOCAB, num_key_value_heads=fx.KV_HEADS, max_position_embeddings=512,
                           head_dim=fx.HEAD_DIM, tie_word_embeddings=True, rope_theta=1e6)
    model = qwen3.Model(args)
    mx.eval(model.parameters())
    return model


def _drafter(name: str, tmp_path):
    """A drafter whose head rows are reached in the way ``name`` says."""
    if name == "own":  # deepspec layout, its own untied lm_head
        return _with_markov_bias(tiny.dspark_drafter())
    if name == "gated":
        path = fx.write_deepspec(tmp_path / "gated", markov_head_type="gated")
        drafter, _ = load_drafter(str(path), target_vocab_size=fx.VOCAB, target_num_layers=fx.TARGET_LAYERS,
                                  target_hidden_size=fx.HIDDEN)
        return _with_markov_bias(drafter)
    if name == "bound_untied":  # the target's nn.Linear lm_head
        return tiny.dflash_drafter(tiny.tiny_target())
    if name == "bound_tied":  # the target's embedding rows
        return tiny.dflash_drafter(tiny.tiny_target()).bind_target_model(_tied_qwen3_target())
    if name == "no_rows":  # bound without a row reader: columns taken from the full product
        embed = nn.Embedding(fx.VOCAB, fx.HIDDEN)
        return tiny.dflash_drafter(tiny.tiny_target()).bind_target(embed, embed.as_linear)
    assert name == "quantized"  # packed head and W2: columns taken from the full products
    return quantize_drafter(_with_markov_bias(tiny.dspark_drafter()), "8bit")


@pytest.mark.parametrize("name", ["own", "gated", "bound_untied", "bound_tied", "no_rows", "quantized"])
def test_draft_logits_over_a_column_subset_equal_the_full_logits_there(name, tmp_path):
    """draft_logits(..., vocab) == draft_logits(...)[:, vocab], and base_logits likewise."""
    drafter = _drafter(name, tmp_path)
    h, prev = _rows()
    full = draft_logits(drafter, h, prev)  # [n, V]
    sub = draft_logits(drafter, h, prev, vocab=VOCAB_SUBSET)  # [n, S]
    assert sub.shape == (h.shape[0], VOCAB_SUBSET.size) and sub.dtype == mx.float32
    assert mx.allclose(sub, mx.take(full, VOCAB_SUBSET, axis=-1), atol=1e-4), name
    base = drafter.base_logits(h, VOCAB_SUBSET)
    assert mx.allclose(base, mx.take(drafter.base_logits(h), VOCAB_SUBSET, axis=-1), atol=1e-4), name


def test_bound_heads_expose_their_rows_only_when_they_can():
    """A tied target's head rows are its embedding rows; a plain bind without a reader has none."""
    tied = tiny.dflash_drafter(tiny.tiny_target()).bind_target_model(_tied_qwen3_target())
    rows = tied._head_rows(VOCAB_SUBSET)
    assert rows.shape == (VOCAB_SUBSET.size, fx.HIDDEN)
    embed = nn.Embedding(fx.VOCAB, fx.HIDDEN)
    assert tiny.dflash_drafter(tiny.tiny_target()).bind_target(embed, embed.as_linear)._head_rows(VOCAB_SUBSET) is None


# ---------------------------------------------------------------- the shortlist and a batch's columns


def _samples(rows: list[list[int]]) -> list[D.Sample]:
    return [D.Sample(np.array(r, dtype=np.int32), np.ones(len(r), dtype=bool)) for r in rows]


def test_frequent_tokens_counts_labels_breaks_ties_by_id_and_reports_coverage():
    """Labels are ids[1:] (the first token of a sample is never predicted); ties go to the smaller id."""
    samples = _samples([[9, 5, 5, 5, 7, 7, 3], [9, 7, 4, 4, 8]])  # labels: 5 x3, 7 x3, 4 x2, 3, 8
    assert frequent_tokens(samples, 2, 16).tolist() == [5, 7]
    assert frequent_tokens(samples, 3, 16).tolist() == [4, 5, 7]
    assert frequent_tokens(samples, 4, 16).tolist() == [3, 4, 5, 7]  # 3 and 8 tie: the smaller id
    assert frequent_tokens(samples, 100, 16).tolist() == [3, 4, 5, 7, 8]  # never a token with no count
    assert label_coverage(np.array([5, 7]), samples) == pytest.approx(6 / 10)


def test_batch_columns_hold_the_shortlist_topk_and_labels_and_map_back_to_ids():
    """C = shortlist ∪ top-k ∪ labels, sorted; the mapped ids index back to the token ids."""
    teacher = Teacher(mx.array([[40, 2], [2, 90]], dtype=mx.int32), mx.array([[-0.1, -3.0], [-0.2, -2.0]]),
                      mx.array([-0.1, -5.0]))
    labels = np.array([40, 77], dtype=np.int32)
    cols = batch_columns(np.array([1, 2, 3], dtype=np.int32), teacher, labels)
    vocab = np.array(cols.vocab)
    assert vocab.tolist() == [1, 2, 3, 40, 77, 90]
    assert vocab[np.array(cols.teacher.ids)].tolist() == [[40, 2], [2, 90]]
    assert vocab[np.array(cols.labels)].tolist() == labels.tolist()
    assert mx.array_equal(cols.teacher.logp, teacher.logp) and mx.array_equal(cols.teacher.label_logp,
                                                                              teacher.label_logp)


# ---------------------------------------------------------------- the restricted KD


def test_restricted_kd_is_the_bucketed_kl_with_q_renormalised_over_the_columns():
    """Computed by hand: p's buckets (top-k, label, rest) against q renormalised over C."""
    rng = np.random.default_rng(0)
    vocab = 30
    t, d = rng.normal(size=vocab) * 2, rng.normal(size=vocab) * 2
    p = np.exp(t) / np.exp(t).sum()
    top = np.argsort(-p)[:3]
    label = int(np.argsort(-p)[10])
    teacher = _teacher_from(mx.array(t[None].astype(np.float32)), mx.array([label]), 3)
    cols = batch_columns(np.array([5, 6, 7, 8], dtype=np.int32), teacher, np.array([label], dtype=np.int32))
    c = np.array(cols.vocab)
    q = np.exp(d[c]) / np.exp(d[c]).sum()  # q over C
    q_of = dict(zip(c.tolist(), q))
    rest_q = sum(v for i, v in q_of.items() if i not in set(top.tolist()) | {label})
    pb = np.array([p[i] for i in top] + [p[label], 1 - p[top].sum() - p[label]])
    qb = np.array([q_of[i] for i in top] + [q_of[label], rest_q])
    expect = float((pb * np.log(pb / qb)).sum())
    logits = mx.array(d[c][None].astype(np.float32))  # [1, C]
    got = kd_rows(logits, mx.logsumexp(logits, axis=-1, keepdims=True), cols.labels, cols.teacher)
    assert got.item() == pytest.approx(expect, rel=1e-4, abs=1e-6)


def test_kd_losses_with_a_whole_vocabulary_shortlist_equal_the_unrestricted_ones(tmp_path):
    """Columns = every token: the restricted KD, CE and match are the full ones (and zero at q = p
    stays zero), through the real drafter and its gated Markov head."""
    target, drafter = tiny.tiny_target(), _drafter("gated", tmp_path)
    rng = np.random.default_rng(0)
    samples = [D.Sample(rng.integers(0, 240, 24), np.ones(24, dtype=bool)) for _ in range(2)]
    batch = _kd_batch(samples, target, drafter, np.array([[2, 9], [4, 15]]))
    h_rows = draft_rows(drafter, train_backbone(drafter, batch.taps, batch.block_ids, batch.anchors,
                                                batch.attn_mask), batch.rows)
    teacher = _teacher_from(target.lm_head(batch.hidden.reshape(-1, batch.hidden.shape[-1])[batch.target_rows]),
                            batch.labels, K)
    weights = {"kd": 1.0, "hidden": 0.5}
    _, full = kd_losses(drafter, h_rows, batch, teacher, weights)
    batch.columns = batch_columns(np.arange(fx.VOCAB, dtype=np.int32), teacher, np.array(batch.labels))
    _, restricted = kd_losses(drafter, h_rows, batch, teacher, weights)
    for key in ("kd", "ce", "hidden"):
        assert restricted[key].item() == pytest.approx(full[key].item(), rel=1e-4), key
    assert mx.array_equal(restricted["greedy_match"], full["greedy_match"])
    own = _teacher_from(draft_logits(drafter, h_rows, batch.prev_ids), batch.labels, K)
    batch.columns = batch_columns(np.arange(fx.VOCAB, dtype=np.int32), own, np.array(batch.labels))
    _, same = kd_losses(drafter, h_rows, batch, own, {"kd": 1.0})
    assert abs(same["kd"].item()) < 1e-4


def test_restricted_kd_sends_gradient_only_through_the_columns_rows():
    """The head's rows outside C get no gradient from the KD (the saving), rows inside C do."""
    drafter = _with_markov_bias(tiny.dspark_drafter())
    h, prev = _rows(2, 4)
    labels = mx.array([3, 17, 42, 99], dtype=mx.int32)
    teacher = _teacher_from(draft_logits(drafter, h, prev) * 0.5, labels, 2)
    cols = batch_columns(np.array(VOCAB_SUBSET), teacher, np.array(labels))

    def loss(w2):
        drafter.markov_head.markov_w2.weight = w2
        logits = draft_logits(drafter, h, prev, vocab=cols.vocab)
        return kd_rows(logits, mx.logsumexp(logits, axis=-1, keepdims=True), cols.labels, cols.teacher).sum()

    g = np.array(mx.grad(loss)(drafter.markov_head.markov_w2.weight))  # [V, r]
    touched = np.nonzero(np.abs(g).sum(axis=1))[0]
    assert set(touched.tolist()) <= set(np.array(cols.vocab).tolist()) and touched.size > 0


# ---------------------------------------------------------------- a run with a shortlist


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from tests.engine.test_train import _greedy_samples

    model = tiny.tiny_target_model(0, scale=4.0)
    return _greedy_samples(model, 80, 8, 48, tmp_path_factory.mktemp("gen") / "continuations.jsonl")


def test_shortlist_run_learns_resumes_exactly_and_scores_the_whole_vocabulary(tmp_path, corpus):
    """A kd run on a 32-token shortlist: batches carry the columns, the held-out match rises
    (instruments over the whole vocabulary, with the share of argmaxes outside the shortlist),
    and a resumed run ends with the same weights as an uninterrupted one."""
    cfg = _v2_config(tmp_path / "a", steps=40, regress_steps=4, early_steps=30, final_steps=4, instrument_every=20,
                     checkpoint_every=10, shortlist=32)
    trainer = _trainer(cfg, corpus[:-8], corpus[-8:])
    assert trainer.shortlist.size == 32 and np.all(np.diff(trainer.shortlist) > 0)
    batch = trainer.make_batch(5, 2)
    assert batch.columns is not None and batch.columns.vocab.size >= 32
    assert trainer.monitor.batches(trainer)[0].columns is None  # held-out: the whole vocabulary
    before = trainer.monitor.measure(trainer, 0)["greedy_match"]
    result = trainer.run()
    after = result.instruments[-1]["greedy_match"]
    assert after["by_position"][0] > before["by_position"][0] + 0.2, (before, after)
    assert 0.0 <= after["outside_shortlist"] <= 1.0
    again = _trainer(_v2_config(tmp_path / "b", **_kw(cfg)), corpus[:-8], corpus[-8:])
    again.monitor = None
    with pytest.raises(TrainingStopped):  # a crash after step 15: the resume starts from step 10
        again.run(stop_after=15)
    again = _trainer(_v2_config(tmp_path / "b", **_kw(cfg)), corpus[:-8], corpus[-8:])
    again.monitor = None
    again.run(resume=True)
    for (name, a), (_, b) in zip(_flat(trainer.drafter), _flat(again.drafter)):
        assert mx.array_equal(a, b), name


def _kw(cfg) -> dict:
    keys = ("steps", "regress_steps", "early_steps", "final_steps", "instrument_every", "checkpoint_every", "shortlist")
    return {k: getattr(cfg, k) for k in keys}


def _flat(drafter):
    from mlx.utils import tree_flatten

    return tree_flatten(drafter.trainable_parameters())


def test_pipeline_writes_the_shortlist_and_records_it(tmp_path):
    """shortlist.json holds the ids and their label coverage; training.json's recipe has the size."""
    from engine.train.pipeline import DataConfig, run_with_model
    from engine.train.progress import ProgressBar
    from tests.engine.test_train import ByteTokenizer, _write_text

    cfg = _v2_config(tmp_path, steps=6, regress_steps=1, early_steps=3, final_steps=1, instrument_every=3,
                     eval_max_tokens=4, checkpoint_every=6, shortlist=24)
    data = DataConfig(text=(str(_write_text(tmp_path / "corpus.txt")),), heldout=2, num_eval_prompts=1)
    report = run_with_model(cfg, data, tiny.tiny_target_model(0), ByteTokenizer(), "tiny",
                            bar=ProgressBar(6, io.StringIO(), tty=False))
    saved = json.loads((tmp_path / "shortlist.json").read_text())
    assert saved["size"] == len(saved["ids"]) <= 24 and 0 < saved["label_coverage"] <= 1
    assert report["train"]["recipe"]["shortlist"] == 24
    assert "outside_shortlist" in report["instruments"][-1]["greedy_match"]
