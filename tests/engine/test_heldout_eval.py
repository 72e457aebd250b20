"""Held-out drafter report (`engine.train.heldout_eval`, `dspark eval-drafter`) on tiny models."""

from __future__ import annotations

import statistics

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from engine.api import EngineInfo, SpecConfig
from engine.runtime import Runtime
from engine.scheduler import Scheduler
from engine.train.heldout_eval import acceptance_by_cap, calibration, paired_speed
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
