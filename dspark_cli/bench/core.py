"""One benchmark run over loaded runtimes: arms, warm-up, interleaved timing, summary, report dict.

Kept apart from model loading so tests can pass tiny in-process runtimes and get the same report.
"""

from __future__ import annotations

import datetime as dt

from dspark_cli.bench import runner, structured, summary, workloads
from dspark_cli.bench.arms import GrammarPrompt, build_arms
from dspark_cli.bench.plan import BenchPlan

VERIFY_WIDTHS = 9  # anchor + up to 8 drafts


def encode_prompts(prompts, tokenizer) -> list[tuple[str, list[int]]]:
    """(id, token ids) per prompt, through the target's chat template; a prompt with a schema gets
    `GrammarPrompt` ids, which engine arms decode under that schema."""
    from engine.text import apply_chat_template

    def encode(p) -> list[int]:
        ids = list(apply_chat_template(tokenizer, list(p.messages)))
        return ids if p.schema is None else GrammarPrompt(ids, p.schema)

    return [(p.id, encode(p)) for p in prompts]


def apple_silicon_prediction(model: dict, curve) -> dict:
    """The performance model on an assumed flat (bandwidth-bound) verify curve: a prediction only."""
    from engine.costs import flat_verify_curve

    if not model["by_cap"]:
        return {}
    flat = flat_verify_curve(curve)
    acceptance = model["by_cap"][-1]["acceptance_by_position"]
    cap, _ = flat.best_cap(acceptance, len(acceptance))
    return {"label": "prediction (assumed verify curve), not a measurement", "row_growth": flat.meta["row_growth"],
            "best_cap": cap, "speedup": round(flat.predicted_speedup(acceptance, cap), 4),
            "by_cap": {k: round(flat.predicted_speedup(acceptance, k), 4) for k in range(1, len(acceptance) + 1)}}


def measure(baseline, spec_runtimes: dict, prompts: list[tuple[str, list[int]]], plan: BenchPlan,
            progress_factory=None, kinds: dict[str, str] | None = None) -> tuple[list[dict], dict, list]:
    """Warm up and time every arm; returns (records, summary, arms).

    `kinds` maps prompt ids to their workload kind; with it the summary has per-workload rows."""
    arms = build_arms(baseline, spec_runtimes, plan.caps_for, plan.mlx_lm)
    records = time_arms(arms, prompts, plan, progress_factory)
    curves = {mode: rt.curve for mode, rt in spec_runtimes.items() if rt.curve is not None}
    summ = summarize(records, arms, curves, kinds)
    summ["target_verify"] = target_verify_curve(baseline.target)
    return records, summ, arms


def time_arms(arms: list, prompts: list[tuple[str, object]], plan: BenchPlan, progress_factory=None) -> list[dict]:
    """One untimed warm-up per arm, then the interleaved timed blocks; the run records.

    A prompt is whatever its arms take: token ids for engine arms, chat messages for server arms."""
    bar = progress_factory(len(arms) * (1 + len(prompts) * plan.repeats)) if progress_factory else None
    tick = bar.advance if bar else (lambda note: None)
    for arm in arms:
        arm.run(prompts[0][1], plan.warmup_tokens)
        tick(f"warm-up {arm.name}")
    records = runner.run_blocks(arms, prompts, plan.repeats, plan.max_tokens, tick)
    if bar:
        bar.close()
    return records


def summarize(records: list[dict], arms: list, curves: dict, kinds: dict[str, str] | None) -> dict:
    """The summary of `summary.summarize`, plus per-workload rows when the prompts' kinds are known."""
    summ = summary.summarize(records, arms, curves)
    grammar = structured.summarize_grammar(records, [a.name for a in arms])
    if grammar:
        summ["grammar"] = grammar
    if kinds:
        summ["workloads"] = workloads.summarize_workloads(records, kinds, [a.name for a in arms])
    return summ


def target_verify_curve(target, max_len: int = VERIFY_WIDTHS - 1) -> dict:
    """The target's verify cost at widths 1..VERIFY_WIDTHS (drafter-independent; measured every run)
    at the loaded BLAS thread count, and under ``other_threads`` at each other count decode may use."""
    from engine.backend import STATE, blas_threads, thread_choices
    from engine.costs import CONTEXT, measure_verify

    def timed(threads: int | None) -> dict:
        with blas_threads(threads):
            verify = measure_verify(target, max_len)
        return {"threads": threads, "ms": [round(1000 * t, 3) for t in verify],
                "relative": [round(t / verify[0], 3) for t in verify]}

    loaded = timed(None)
    loaded["threads"] = STATE.threads
    others = [timed(n) for n in thread_choices() if n != STATE.threads]
    return {"context": CONTEXT, "widths": list(range(1, len(loaded["ms"]) + 1)), **loaded, "other_threads": others}


def build_report(records: list[dict], summ: dict, spec_runtimes: dict, *, plan: BenchPlan, environment: dict,
                 prompt_meta: dict, target: str, command: str, skipped: list[str]) -> dict:
    """The report.json content (plots are added by the caller once written)."""
    apple = {mode: apple_silicon_prediction(summ["model"][mode], rt.curve)
             for mode, rt in spec_runtimes.items() if mode in summ["model"]}
    return {
        "schema": 1, "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": command,
        "target": target, "drafters": {m: rt.info.drafter for m, rt in spec_runtimes.items()},
        "auto_cap_at_start": {m: rt.info.cap for m, rt in spec_runtimes.items()},
        "environment": environment, "prompts": prompt_meta, "skipped": skipped,
        "plan": {"max_tokens": plan.max_tokens, "repeats": plan.repeats, "per_kind": plan.per_kind,
                 "modes": list(plan.modes), "mlx_lm": plan.mlx_lm},
        "summary": summ, "apple_silicon_prediction": apple, "runs": records,
    }
