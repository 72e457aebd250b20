"""`dspark bench` on tiny in-process models: report structure, paired ratios, the model's numbers.

Speed is never asserted (these are seconds-long runs on a shared CPU); what is checked is that the
report has every part, that each ratio is the quotient of two runs of the same block, that blocks
alternate their order, and that predictions are the cost curve's formula applied to measured rates.
"""

from __future__ import annotations

import json
import statistics

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from dspark_cli.bench import core, runner, summary, write_all, wrote_message
from dspark_cli.bench.plan import QUICK, BenchPlan
from dspark_cli.bench.prompts import load_prompts
from engine import costs
from engine.api import EngineInfo, SpecConfig
from engine.runtime import Runtime
from engine.scheduler import expected_tokens
from tests.engine import tiny

PLAN = BenchPlan(max_tokens=10, repeats=2, warmup_tokens=2)
PROMPTS = [("p-a", [5, 6, 7, 8]), ("p-b", [9, 10, 11])]


def _runtime(tokenizer, target, drafter, mode: str) -> Runtime:
    curve = costs.measure_curve(target, drafter, drafter.config.max_drafts) if drafter else None
    cap = curve.best_cap([0.6] * drafter.config.max_drafts, drafter.config.max_drafts)[0] or 1 if curve else None
    info = EngineInfo(model_id="tiny", model_path="-", mode=mode, drafter="random" if drafter else None, cap=cap,
                      context_length=256, sampler="rejection")
    return Runtime(target, drafter, tokenizer, info, frozenset(), SpecConfig(mode=mode, max_draft="auto"), curve)


@pytest.fixture(scope="module")
def bench_run(default_model_dir, tmp_path_factory):
    """A whole tiny bench: baseline, dspark and dflash (every cap and auto) and mlx-lm, written to disk."""
    tok = load_tokenizer(default_model_dir)  # ids < 256 decode fine; prompts are given as ids
    baseline = _runtime(tok, tiny.tiny_target(), None, "baseline")
    dflash_target = tiny.tiny_target()
    spec = {"dspark": _runtime(tok, tiny.tiny_target(), tiny.dspark_drafter(), "dspark"),
            "dflash": _runtime(tok, dflash_target, tiny.dflash_drafter(dflash_target), "dflash")}
    records, summ, arms = core.measure(baseline, spec, PROMPTS, PLAN)
    env = {"device": "cpu", "platform": "test", "cores": 2, "mlx": "x", "blas": "test", "sgemm_gflops": 1.0}
    rep = core.build_report(records, summ, spec, plan=PLAN, environment=env, target="tiny", command="dspark bench",
                            skipped=["dflash: nothing"], prompt_meta={"file": "t", "sha256": "0" * 64, "count": 2})
    out = write_all(rep, tmp_path_factory.mktemp("bench"))
    return json.loads((out / "report.json").read_text()), out, [a.name for a in arms], spec


def test_report_files_and_structure(bench_run):
    """report.json, report.md and two PNGs exist; every arm, prompt and section is present."""
    rep, out, names, _ = bench_run
    assert names == ["baseline", "dspark@1", "dspark@2", "dspark@3", "dspark@4", "dspark@auto",
                     "dflash@1", "dflash@2", "dflash@3", "dflash@auto", "mlx-lm"]
    for png in ("speedup_vs_cap.png", "acceptance_by_position.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png in rep["plots"]
    assert wrote_message(out, rep["plots"]).endswith("report.md and speedup_vs_cap.png, acceptance_by_position.png")
    md = (out / "report.md").read_text()
    assert "dspark@auto" in md and "Performance model: dflash" in md and "Prediction, not a measurement" in md
    assert "auto's cap before any round" in md and set(rep["auto_cap_at_start"]) == {"dspark", "dflash"}
    s = rep["summary"]
    assert set(s["arms"]) == set(names) and set(s["per_prompt"]) == {"p-a", "p-b"}
    assert set(s["per_prompt"]["p-a"]["dflash@2"]) == {"e2e_tok_s", "decode_tok_s", "speedup_vs_baseline"}
    assert set(s["speedup_vs_baseline"]) == set(names) - {"baseline"}
    assert set(s["speedup_vs_mlx_lm"]) == set(names) - {"mlx-lm"}
    assert len(rep["runs"]) == len(names) * len(PROMPTS) * PLAN.repeats
    assert set(s["arms"]["dspark@4"]["round_ms"]) == {"draft", "verify", "accept", "other"}
    assert len(s["arms"]["dspark@4"]["acceptance_by_position"]) == 4
    assert all(r["same_as_baseline"] for r in rep["runs"]), "greedy decoding must match baseline in every arm"
    tv = s["target_verify"]
    assert tv["widths"] == list(range(1, 10)) and len(tv["ms"]) == 9 and tv["relative"][0] == 1.0
    assert all(len(c["ms"]) == 9 and c["threads"] != tv["threads"] for c in tv["other_threads"])
    assert "target verify cost by width" in md


def test_ratios_come_from_paired_runs(bench_run):
    """Every ratio is arm / reference within one block, and its summary is the median of those."""
    rep, _, names, _ = bench_run
    runs = {(r["block"], r["arm"]): r for r in rep["runs"]}
    for ref, table in (("baseline", "speedup_vs_baseline"), ("mlx-lm", "speedup_vs_mlx_lm")):
        for arm, entry in rep["summary"][table].items():
            assert len(entry["pairs"]) == len(PROMPTS) * PLAN.repeats
            for pair in entry["pairs"]:
                a, b = runs[(pair["block"], arm)], runs[(pair["block"], ref)]
                assert a["prompt"] == b["prompt"] == pair["prompt"] and a["pass"] == b["pass"]
                assert pair["ratio"] == pytest.approx(summary.e2e_tok_s(a) / summary.e2e_tok_s(b), abs=1e-4)
            assert entry["e2e"]["median"] == pytest.approx(statistics.median(p["ratio"] for p in entry["pairs"]),
                                                           abs=1e-4)


def test_blocks_alternate_order(bench_run):
    """Each block runs every arm once; odd blocks run them in reverse order (A B ... B A)."""
    rep, _, names, _ = bench_run
    for block in range(len(PROMPTS) * PLAN.repeats):
        order = [r["arm"] for r in rep["runs"] if r["block"] == block]
        assert order == (names if block % 2 == 0 else names[::-1])
    assert runner.schedule(2, 2, ["a", "b"]) == [(0, 0, ["a", "b"]), (0, 1, ["b", "a"]), (1, 0, ["a", "b"]),
                                                 (1, 1, ["b", "a"])]


def test_predictions_apply_the_cost_curve_to_measured_acceptance(bench_run):
    """Predicted speedup per cap = expected tokens per round / relative round time, from the curve."""
    rep, _, _, spec = bench_run
    for mode, model in rep["summary"]["model"].items():
        curve = spec[mode].curve
        assert [r["cap"] for r in model["by_cap"]] == list(range(1, spec[mode].drafter.config.max_drafts + 1))
        for r in model["by_cap"]:
            want = expected_tokens(r["acceptance_by_position"], r["cap"]) / curve.relative_round_time(r["cap"])
            assert r["predicted_speedup"] == pytest.approx(want, abs=1e-3)
            assert r["measured_speedup"] == rep["summary"]["speedup_vs_baseline"][f"{mode}@{r['cap']}"]["decode"]["median"]
        assert model["auto_vs_best_fixed"] is not None and model["best_fixed_cap"] in range(1, 5)
        assert rep["apple_silicon_prediction"][mode]["label"].startswith("prediction")


def test_prompt_set_and_quick_plan():
    """The shipped v1 prompt set covers chat, code and docs; --quick takes one of each and 3 caps."""
    prompts, meta = load_prompts(per_kind=QUICK.per_kind)
    assert [p.kind for p in prompts] == ["chat", "code", "docs"] and meta["file"] == "prompts-v1.jsonl"
    assert len(load_prompts()[0]) == meta["count"] + 9
    assert QUICK.caps_for(6) == [1, 3, 6] and QUICK.caps_for(5) == [1, 3, 5] and QUICK.caps_for(2) == [1, 2]
    assert BenchPlan(caps=(2, 9)).caps_for(5) == [2, 5] and BenchPlan().caps_for(3) == [1, 2, 3]


def test_cli_plan_from_flags():
    """--quick sets the budgeted plan, explicit flags override it, unknown modes are refused."""
    from dspark_cli.bench import _plan
    from dspark_cli.main import build_parser

    args = build_parser().parse_args(["bench", "--quick", "--max-tokens", "16", "--modes", "dspark", "--no-mlx-lm"])
    plan = _plan(args)
    assert (plan.per_kind, plan.max_tokens, plan.modes, plan.mlx_lm, plan.cap_budget) == (1, 16, ("dspark",), False, 3)
    assert _plan(build_parser().parse_args(["bench"])).per_kind is None
    with pytest.raises(SystemExit):
        _plan(build_parser().parse_args(["bench", "--modes", "eagle"]))


def test_baseline_only_report_writes_and_claims_no_plots(bench_run, tmp_path):
    """With no drafter arm, `dspark bench` writes no PNG and its closing line says so."""
    rep, _, _, _ = bench_run
    baseline_only = {**rep, "summary": {**rep["summary"], "model": {}}}
    out = write_all(baseline_only, tmp_path / "b")
    assert baseline_only["plots"] == [] and not list(out.glob("*.png"))
    message = wrote_message(out, baseline_only["plots"])
    assert "no plots" in message and ".png" not in message


def test_structured_arm_reports_the_grammar_cost(default_target, tmp_path):
    """`--structured`: SmolLM2 answers the JSON-schema set under its schemas in baseline and lookup;
    the report gets a grammar table (mask rows per round, time per row, share of decode time)."""
    from dspark_cli.bench import _plan
    from dspark_cli.bench.prompts import DEFAULT_STRUCTURED
    from dspark_cli.main import build_parser
    from engine.lookup import LookupConfig, LookupDrafter
    from engine.models.target import Target
    from engine.runtime import eos_ids
    from engine.scheduler import CostCurve

    args = build_parser().parse_args(["bench", "--structured", "--modes", "lookup"])
    assert _plan(args).mlx_lm is False
    with pytest.raises(SystemExit):
        _plan(build_parser().parse_args(["bench", "--structured", "--server"]))
    model, tok = default_target
    prompts, meta = load_prompts(DEFAULT_STRUCTURED, per_kind=2)
    assert meta["file"] == "structured-v1.jsonl" and all(p.schema for p in prompts)
    curve = CostCurve(verify_s=[1.0, 1.2, 1.3, 1.4], draft_fixed_s=0.0, draft_per_token_s=0.0)

    def runtime(drafter, mode):
        info = EngineInfo(model_id="smollm2", model_path="-", mode=mode, drafter=None, cap=None if drafter is None else 3,
                          context_length=8192, sampler="rejection")
        return Runtime(Target(model), drafter, tok, info, eos_ids(tok), SpecConfig(mode=mode, max_draft=3),
                       None if drafter is None else curve, None if drafter is None else 3)

    lookup = runtime(LookupDrafter(LookupConfig(min_ngram=1, max_ngram=3, max_drafts=3)), "lookup")
    plan = BenchPlan(max_tokens=24, repeats=1, warmup_tokens=2, caps=(3,), mlx_lm=False)
    records, summ, _ = core.measure(runtime(None, "baseline"), {"lookup": lookup}, core.encode_prompts(prompts, tok), plan)
    grammar = summ["grammar"]
    assert set(grammar) == {"baseline", "lookup@3", "lookup@auto"}
    for row in grammar.values():
        assert row["runs"] == 2 and row["masks_per_round"] >= 1 and row["us_per_mask"] > 0, row
        assert 0 < row["share_of_decode"] < 1
    env = {"device": "cpu", "platform": "test", "cores": 2, "mlx": "x", "blas": "test", "sgemm_gflops": 1.0}
    rep = core.build_report(records, summ, {"lookup": lookup}, plan=plan, environment=env, target="smollm2",
                            command="dspark bench --structured", skipped=[], prompt_meta=meta)
    text = (write_all(rep, tmp_path) / "report.md").read_text()
    assert "## Grammar masks" in text and "| lookup@3 |" in text
