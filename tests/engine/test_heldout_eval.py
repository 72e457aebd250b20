"""Held-out drafter report (`engine.train.heldout_eval`, `dspark eval-drafter`) on tiny models."""

from __future__ import annotations

import statistics

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from engine.api import EngineInfo, SpecConfig
from engine.runtime import Runtime
from engine.scheduler import Scheduler
from engine.train.batch import attention_mask
from engine.train.evaluate import zeroed_context
from engine.train.forward import train_backbone
from engine.train.heldout_eval import acceptance_by_cap, calibration, context_ablation, paired_speed
from tests.engine import tiny

PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 3, 9, 200, 17]]


def test_acceptance_by_cap_reports_each_cap_within_its_bounds():
    """One row per cap; tau in [1, cap + 1]; one acceptance rate per verified position."""
    target, drafter = tiny.tiny_target(), tiny.dspark_drafter()
    rows = acceptance_by_cap(target, drafter, PROMPTS, 16, [1, 2, drafter.config.max_drafts])
    assert [r["cap"] for r in rows] == [1, 2, drafter.config.max_drafts]
    for row in rows:
        assert 1.0 <= row["tau"] <= row["cap"] + 1
        assert len(row["acceptance_by_position"]) == row["cap"] and row["rounds"] > 0


def test_zeroed_context_drafts_as_a_drafter_without_fc_and_is_undone_on_exit():
    """Inside `zeroed_context` the serving, reference and training forwards equal a twin whose fc
    weight is zero (the context rows project to 0); outside, the drafter reads its context again."""
    drafter, twin = tiny.dspark_drafter(), tiny.dspark_drafter()
    twin.fc.weight = mx.zeros_like(twin.fc.weight)
    taps = mx.random.normal((1, 5, drafter.config.num_taps * drafter.config.hidden_size), key=mx.random.key(1))
    block = mx.array([[7] + [drafter.config.mask_token_id] * (drafter.config.block_size - 1)])
    real = drafter.reference_forward(taps, block)
    with zeroed_context(drafter):
        blind = drafter.reference_forward(taps, block)
        assert mx.allclose(blind, twin.reference_forward(taps, block), atol=1e-5)
        assert mx.allclose(drafter.backbone(taps, block, drafter.make_cache()), blind, atol=1e-4)
        width = taps.shape[1]
        trained = train_backbone(drafter, mx.concatenate([taps, mx.ones_like(taps[:, :2])], axis=1), block,
                                 mx.array([width]), mx.array(attention_mask(np.array([[width]]), width + 2, block.shape[1])))
        assert mx.allclose(trained, blind, atol=1e-4)  # the training forward is zeroed too
    assert not mx.allclose(blind, real, atol=1e-3)
    assert mx.allclose(drafter.reference_forward(taps, block), real, atol=1e-6)


def test_context_ablation_reports_the_zero_context_twin_and_the_gain(context_spy):
    """The real pass reads the taps, then the blind pass sees only zero rows, through the real
    engine loop: its tau and acceptance are those of the fc-less twin, and the gain their
    difference. A real row passed in is reused, and must be for the same cap."""
    target, drafter, twin = tiny.tiny_target(), tiny.dspark_drafter(), tiny.dspark_drafter()
    report = context_ablation(target, drafter, PROMPTS, 16, 3)
    assert False in context_spy and True in context_spy and context_spy == sorted(context_spy)
    twin.fc.weight = mx.zeros_like(twin.fc.weight)
    (real,) = acceptance_by_cap(target, drafter, PROMPTS, 16, [3])
    (blind,) = acceptance_by_cap(target, twin, PROMPTS, 16, [3])
    assert report["tau"] == real["tau"] and report["tau_zero_context"] == blind["tau"]
    assert report["acceptance_by_position_zero_context"] == blind["acceptance_by_position"]
    assert report["context_gain"] == pytest.approx(real["tau"] - blind["tau"], abs=1e-4)
    given = {**real, "tau": 9.0}  # a passed-in real row is used as is, not measured again
    assert context_ablation(target, drafter, PROMPTS, 16, 3, with_context=given)["tau"] == 9.0
    with pytest.raises(ValueError, match="cap 3, not 2"):
        context_ablation(target, drafter, PROMPTS, 16, 2, with_context=given)


def test_zeroed_context_nests_and_is_undone_after_an_error(context_spy):
    """An inner block leaves the outer one zeroed; an exception still restores the real path."""
    drafter = tiny.dspark_drafter()
    taps = mx.ones((1, 3, drafter.config.num_taps * drafter.config.hidden_size))
    with zeroed_context(drafter):
        with zeroed_context(drafter):
            drafter.project_context(taps)
        drafter.project_context(taps)
    with pytest.raises(RuntimeError), zeroed_context(drafter):
        raise RuntimeError("boom")
    drafter.project_context(taps)
    assert context_spy == [True, True, False]
    assert "project_context" not in vars(drafter)


def test_calibration_scores_raw_logits_whatever_temperatures_the_drafter_stores():
    """The decoder applies stored STS temperatures; the report undoes them, so "before" is the raw
    head's ECE (equal with and without stored temperatures) and "after" uses the stored ones."""
    target = tiny.tiny_target()
    plain = tiny.dspark_drafter()
    drafts = plain.config.max_drafts
    scaled = tiny.dspark_drafter(sts_temperatures=[2.5] * drafts)
    a = calibration(target, plain, PROMPTS, 24)
    b = calibration(target, scaled, PROMPTS, 24)
    assert b["temperatures"] == [2.5] * drafts and a["temperatures"] == [1.0] * drafts
    assert a["ece_before"] == pytest.approx(b["ece_before"], abs=1e-6)
    assert a["ece_before"] == pytest.approx(a["ece_after"], abs=1e-9)
    assert b["ece_after"] != pytest.approx(b["ece_before"], abs=1e-6)
    assert a["samples_by_position"][0] == a["rounds"] > 0


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return load_tokenizer(default_model_dir)


def _runtime(tokenizer, target, drafter) -> Runtime:
    mode = "dspark" if drafter is not None else "baseline"
    info = EngineInfo(model_id="tiny", model_path="-", mode=mode, drafter="random" if drafter else None,
                      cap=3 if drafter else None, context_length=256, sampler="rejection")
    runtime = Runtime(target, drafter, tokenizer, info, frozenset(), SpecConfig(mode=mode, max_draft=3))
    runtime.make_scheduler = lambda: Scheduler(3) if drafter else None
    return runtime


def test_paired_speed_pairs_each_prompt_and_checks_the_outputs_agree(tokenizer):
    """Every prompt runs in both modes; greedy outputs agree (lossless); the summary is the median
    of the per-prompt ratios, each the prompt's own spec / baseline tokens per second."""
    target = tiny.tiny_target()
    spec, base = _runtime(tokenizer, target, tiny.dspark_drafter()), _runtime(tokenizer, target, None)
    report = paired_speed(spec, base, PROMPTS, 12)
    rows = report["prompts"]
    assert len(rows) == len(PROMPTS) and report["all_outputs_identical"]
    for row in rows:
        assert row["tokens"] == 12 and row["cap"] == 3
        assert row["ratio"] == pytest.approx(row["spec_tok_s"] / row["baseline_tok_s"], rel=1e-3)
    assert report["median_ratio"] == pytest.approx(statistics.median(r["ratio"] for r in rows), abs=1e-4)


def test_cli_registers_eval_drafter():
    """`dspark eval-drafter` parses its flags and refuses baseline mode."""
    from dspark_cli.main import build_parser

    args = build_parser().parse_args(["eval-drafter", "--prompts", "a.jsonl", "--prompts", "b.jsonl",
                                      "--caps", "1,3", "--speed-prompts", "5"])
    assert args.prompts == ["a.jsonl", "b.jsonl"] and args.caps == "1,3" and args.speed_prompts == 5
    args.mode = "baseline"
    assert args.run(args) == 2


def test_eval_drafter_set_report_has_caps_calibration_and_the_context_ablation_at_the_best_cap(tokenizer, context_spy):
    """One prompt set's report: a row per cap, the best of them, and the zero-context pass at
    that cap reusing its real-context row."""
    from argparse import Namespace

    from dspark_cli.eval_drafter import _measure_set

    runtime = _runtime(tokenizer, tiny.tiny_target(), tiny.dspark_drafter())
    out = _measure_set(runtime, PROMPTS, Namespace(max_tokens=12, caps="1,3"))
    assert [r["cap"] for r in out["by_cap"]] == [1, 3]
    best = max(out["by_cap"], key=lambda r: r["tau"])
    ablation = out["context_ablation"]
    assert ablation["cap"] == out["best_cap"] == best["cap"] and ablation["tau"] == out["best_tau"]
    assert 1.0 <= ablation["tau_zero_context"] <= ablation["cap"] + 1
    assert len(ablation["acceptance_by_position_zero_context"]) == ablation["cap"]
    assert True in context_spy  # the ablation pass really ran on zero rows
    assert out["calibration"]["rounds"] > 0
