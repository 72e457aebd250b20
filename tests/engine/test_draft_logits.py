"""One function forms draft logits (`engine.models.drafter.draft_logits`), so a gated Markov head,
which needs the drafter row h, trains, loads, serves and is timed; rnn heads are refused clearly."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import engine  # noqa: F401  (loads the fast BLAS; must come before mlx.core)

# isort: split
import mlx.core as mx
import pytest

from engine import costs
from engine.api import SpecStats
from engine.loading.drafter import load_drafter
from engine.models.drafter import draft_logits, draft_rows
from engine.models.drafter_config import DrafterConfigError
from engine.models.target import Target
from engine.sampling import SamplerSettings
from engine.scheduler import Scheduler
from engine.samplers import make_sampler
from engine.spec import DecodeOptions, SpecDecoder
from engine.train.config import TrainConfig
from engine.train.pipeline import DataConfig, run_with_model
from tests.engine import drafter_fixtures as fx
from tests.engine import tiny
from tests.engine.test_train import ByteTokenizer, _config, _quiet, _write_text

GREEDY = SamplerSettings(temperature=0.0)
PROMPTS = [[1, 17, 42, 99, 5], [200, 3, 3, 3, 7, 8, 9, 10, 11, 12]]
ENGINE = Path(__file__).resolve().parents[2] / "engine"


def _generate(target: Target, drafter, prompt: list[int], max_tokens: int, cap: int = 4) -> tuple[list[int], SpecStats]:
    """Greedy ids from SpecDecoder (drafter None: plain decoding), invariants checked every round."""
    opts = DecodeOptions(make_sampler(GREEDY, "rejection", 0), stop_ids=frozenset())
    stats = SpecStats(mode="baseline" if drafter is None else "dspark", cap=cap)
    dec = SpecDecoder(target, drafter, Scheduler(cap) if drafter is not None else None, opts, stats)
    out = dec.prefill(prompt)
    while len(out) < max_tokens and not dec.done:
        out += dec.step(max_tokens - len(out))
        dec.check_invariants()
    return out, stats


def _assert_serves_like_baseline(target: Target, drafter) -> None:
    for prompt in PROMPTS:
        plain, _ = _generate(target, None, prompt, 20)
        spec, stats = _generate(target, drafter, prompt, 20)
        assert spec == plain, prompt
        assert stats.drafted_tokens > 0  # speculative rounds really ran


def _gated_checkpoint(tmp_path: Path) -> tuple:
    """A random gated DeepSpec checkpoint loaded through the normal loader."""
    path = fx.write_deepspec(tmp_path / "gated", markov_head_type="gated")
    return load_drafter(str(path), target_vocab_size=fx.VOCAB, target_num_layers=fx.TARGET_LAYERS,
                        target_hidden_size=fx.HIDDEN)


# ---------------------------------------------------------------- the one function


def test_draft_logits_is_base_plus_gated_bias_and_takes_a_precomputed_base(tmp_path):
    """draft_logits = lm_head(h) + W2(gate(h, W1[prev]) * W1[prev]); a passed base gives the same rows."""
    drafter, _ = _gated_checkpoint(tmp_path)
    h = mx.random.normal((3, fx.HIDDEN), key=mx.random.key(1))  # [n, d]
    prev = mx.array([5, 9, 200])  # [n]
    expected = drafter.base_logits(h) + drafter.markov_bias(prev, h)  # [n, V]
    assert mx.allclose(draft_logits(drafter, h, prev), expected, atol=1e-5)
    assert mx.allclose(draft_logits(drafter, h, prev, drafter.base_logits(h)), expected, atol=1e-5)
    with pytest.raises(ValueError, match="needs the backbone hidden state"):
        drafter.markov_bias(prev)  # why the old serving call failed: the gated head needs h


def test_engine_adds_the_markov_bias_in_one_place_only():
    """Only engine/models/drafter.py calls markov_bias: training goes through draft_logits, serving and
    costs through draft_rows (draft_logits, over the drafter's shortlist when it has one)."""
    callers = sorted(str(p.relative_to(ENGINE)) for p in ENGINE.rglob("*.py")
                     if re.search(r"\.markov_bias\(", p.read_text()))
    assert callers == ["models/drafter.py"]
    for user, call in (("spec.py", "draft_rows("), ("costs.py", "draft_rows("), ("train/loss.py", "draft_logits(")):
        assert call in (ENGINE / user).read_text(), user
    assert "draft_logits(" in inspect.getsource(draft_rows)


# ---------------------------------------------------------------- gated heads end to end


def test_gated_drafter_trains_saves_loads_and_serves_greedy_equal_to_baseline(tmp_path):
    """`--markov-head gated` through the CLI's training entry point, then the normal loader and real
    speculative rounds: the output is the baseline's, and the gate's weights were trained."""
    data = DataConfig(text=(str(_write_text(tmp_path / "corpus.txt")),), heldout=2, num_eval_prompts=1)
    cfg = _config(tmp_path / "run", markov_head_type="gated", steps=6, checkpoint_every=100, log_every=3,
                  seq_len=96, eval_max_tokens=8, feature_cache=False)
    model = tiny.tiny_target_model(0, scale=4.0)
    # The pipeline's held-out evaluation already runs SpecDecoder rounds on the trained gated drafter.
    report = run_with_model(cfg, data, model, ByteTokenizer(), "tiny", bar=_quiet(cfg.steps))
    assert report["heldout"]["greedy"]["rounds"] > 0
    drafter, dcfg = load_drafter(str(cfg.out), target_vocab_size=256, target_num_layers=4)
    assert dcfg.markov_head_type == "gated" and drafter.has_markov
    assert mx.any(drafter.markov_head.markov_w2.weight != 0).item()  # starts at zero: training moved it
    # A fresh copy of the same seeded target: the pipeline's Target left its taps installed on `model`.
    _assert_serves_like_baseline(Target(tiny.tiny_target_model(0, scale=4.0), dcfg.target_layer_ids), drafter)


def test_random_gated_checkpoint_serves_greedy_equal_to_baseline(tmp_path):
    """A gated drafter with a strong random Markov bias still serves losslessly at greedy."""
    drafter, _ = _gated_checkpoint(tmp_path)
    _assert_serves_like_baseline(tiny.tiny_target(0, scale=4.0), drafter)


def test_cost_timer_runs_on_a_gated_drafter(tmp_path, monkeypatch):
    """The round-cost curve times a gated drafter, and its draft pass hands h to the Markov head."""
    drafter, _ = _gated_checkpoint(tmp_path)
    seen: list[bool] = []
    real = drafter.markov_bias

    def spy(prev_ids, h=None):
        seen.append(h is not None)
        return real(prev_ids, h)

    monkeypatch.setattr(drafter, "markov_bias", spy)
    curve = costs.measure_curve(tiny.tiny_target(0), drafter, max_len=2)
    assert seen and all(seen)
    assert curve.draft_fixed_s >= 0.0 and curve.draft_per_token_s >= 0.0 and len(curve.verify_s) == 3


# ---------------------------------------------------------------- rnn heads are refused


def test_rnn_heads_are_refused_at_train_time_and_at_load(tmp_path):
    """train-drafter (flag and config) and the loader refuse rnn heads, saying they are unsupported."""
    from dspark_cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train-drafter", "--data", "d", "--out", str(tmp_path), "--markov-head", "rnn"])
    with pytest.raises(ValueError, match="rnn Markov head.*not supported"):
        TrainConfig(out=tmp_path, markov_head_type="rnn")
    path = fx.write_deepspec(tmp_path / "rnn", markov_head_type="rnn")
    with pytest.raises(DrafterConfigError, match="rnn Markov head.*not supported"):
        load_drafter(str(path), target_vocab_size=fx.VOCAB, target_num_layers=fx.TARGET_LAYERS)
