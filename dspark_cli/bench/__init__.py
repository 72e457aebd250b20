"""`dspark bench`: reproducible speed of baseline and the speculative modes (at every cap and auto) and mlx-lm.

    dspark bench --quick --out bench-quick      # about 10 minutes on a 2-core CPU with SmolLM2-135M
    dspark bench --out bench-full               # the whole prompt set, every cap
    dspark bench --workloads --server --modes lookup --out bench-lookup   # copy-heavy workloads, via HTTP
    dspark bench --structured --modes lookup,dspark --out bench-json        # JSON answers under a schema

Writes report.json (every run, every paired ratio), report.md and PNG plots into --out.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dspark_cli.bench.peer import DEFAULT_PREFILL
from dspark_cli.bench.plan import FULL, QUICK
from dspark_cli.bench.prompts import DEFAULT_PROMPTS, DEFAULT_STRUCTURED, DEFAULT_WORKLOADS
from dspark_cli.progress import ProgressBar, stderr_progress
from engine.api import MODES

# Every engine mode that decodes with a drafter. `baseline` is the reference arm itself, and `auto`
# only picks one of the others; a mode added to the engine is benchable with no change here.
SPEC_MODES = tuple(m for m in MODES if m not in ("baseline", "auto"))
DEFAULT_MODES = ("dspark", "dflash")


def _csv(kind):
    def parse(text: str):
        return tuple(kind(x) for x in text.split(",") if x.strip())
    return parse


def _caps(text: str) -> tuple[int, ...]:
    """--caps: a comma-separated list of fixed caps, or `auto` for no fixed cap (auto's arm only)."""
    return () if text.strip() == "auto" else _csv(int)(text)


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark every mode and cap against baseline and mlx-lm (paired runs)",
                       description="Time baseline, dspark and dflash decoding (caps 1..block and auto) and "
                                   "mlx_lm's generate on a fixed prompt set, interleaved so drift cancels; "
                                   "write report.json, report.md and plots.")
    p.add_argument("--quick", action="store_true",
                   help="one prompt per kind, 48 tokens, caps 1 / middle / largest (under 10 min on 2 cores)")
    p.add_argument("--out", type=Path, metavar="DIR", default=Path("bench-report"), help="output directory (default: bench-report)")
    p.add_argument("--model", default=None, metavar="MODEL", help="mlx-lm directory or Hugging Face id; default: embedded SmolLM2")
    p.add_argument("--dspark-drafter", default=None, metavar="PATH", help="DSpark drafter; default: the shipped/published one")
    p.add_argument("--dflash-drafter", default=None, metavar="PATH", help="DFlash drafter; default: the shipped/published one")
    p.add_argument("--modes", type=_csv(str), metavar="LIST", default=DEFAULT_MODES,
                   help=f"speculative modes, from {','.join(SPEC_MODES)} (default: dspark,dflash)")
    p.add_argument("--caps", type=_caps, metavar="LIST", default=None,
                   help="fixed caps, e.g. 1,2,4, or auto for none (default: 1..block)")
    p.add_argument("--prompts", type=Path, metavar="JSONL", default=DEFAULT_PROMPTS, help="prompt set JSONL (default: the v1 set)")
    p.add_argument("--workloads", action="store_true",
                   help=f"use the copy-heavy workload set ({DEFAULT_WORKLOADS.name}) instead of --prompts")
    p.add_argument("--structured", action="store_true",
                   help=f"answer the JSON-schema set ({DEFAULT_STRUCTURED.name}) under its schemas and report "
                        "the grammar's cost per round (no mlx-lm arm: it has no grammars)")
    p.add_argument("--server", action="store_true",
                   help="time requests to `dspark serve` child processes (baseline and each mode at auto) "
                        "instead of the engine in-process")
    p.add_argument("--per-kind", type=int, metavar="N", default=None, help="prompts per kind (default: all; --quick: 1)")
    p.add_argument("--max-tokens", type=int, metavar="N", default=None, help="tokens per run (default: 128; --quick: 48)")
    p.add_argument("--repeats", type=int, metavar="N", default=None, help="timed passes per prompt (default: 2)")
    p.add_argument("--no-mlx-lm", action="store_true", help="skip the mlx_lm.generate reference")
    p.add_argument("--peer", metavar="LLAMA_BENCH", default=None,
                   help="instead: plain decode and prefill beside llama.cpp's llama-bench (this path) on the same "
                        "GGUF, per thread count (--max-tokens, --repeats apply)")
    p.add_argument("--peer-gguf", metavar="PATH", default=None,
                   help="the GGUF llama.cpp runs (default: the embedded model's; required with --model)")
    p.add_argument("--peer-threads", type=_csv(int), metavar="LIST", default=(1, 2),
                   help="thread counts of the --peer comparison (default: 1,2)")
    p.add_argument("--peer-prefill", type=_csv(int), metavar="LIST", default=DEFAULT_PREFILL,
                   help="prompt lengths of the --peer prefill comparison (default: 512,4096)")
    p.set_defaults(run=run)


def _plan(args):
    bad = [m for m in args.modes if m not in SPEC_MODES]
    if bad:
        raise SystemExit(f"dspark bench: unknown mode(s) {', '.join(bad)}; choose from {', '.join(SPEC_MODES)}")
    if args.server and args.caps:
        raise SystemExit("dspark bench --server: each server decodes at its own --max-draft auto; drop --caps")
    if args.structured and (args.server or args.workloads):
        raise SystemExit("dspark bench --structured runs the engine in-process on its own prompt set; "
                         "drop --server and --workloads")
    base = QUICK if args.quick else FULL
    # Through the servers there is no mlx-lm arm and no fixed cap: each arm is a whole server.
    return base.with_overrides(modes=tuple(args.modes), caps=() if args.server else args.caps,
                               per_kind=args.per_kind, max_tokens=args.max_tokens, repeats=args.repeats,
                               mlx_lm=False if args.no_mlx_lm or args.server or args.structured else None)


def load_runtimes(model: str | None, modes, drafters: dict) -> tuple[object, dict, list[str]]:
    """(baseline runtime, {mode: runtime with a drafter}, notes on modes that have no drafter)."""
    from engine.api import EngineConfig, SpecConfig
    from engine.runtime import build_runtime, with_fresh_curve

    baseline = build_runtime(EngineConfig(model=model, spec=SpecConfig(mode="baseline")), stderr_progress)
    spec, skipped = {}, []
    for mode in modes:
        stderr_progress(f"loading {mode} and measuring its round-cost curve")
        rt = build_runtime(EngineConfig(model=model, spec=SpecConfig(mode=mode, drafter=drafters.get(mode))))
        if rt.drafter is None:
            skipped.append(f"{mode}: no drafter for {rt.info.model_id} (pass --{mode}-drafter PATH to bench one)")
            stderr_progress(f"skipping {mode}: {skipped[-1]}")
            continue
        # The auto curve is re-measured now (and re-cached): a curve cached while the machine was
        # busy would skew both auto's choice and the model's predictions below.
        spec[mode] = with_fresh_curve(rt)
    return baseline, spec, skipped


def run(args) -> int:
    from dspark_cli.bench import core
    from dspark_cli.bench.prompts import load_prompts
    from dspark_cli.doctor import collect

    if args.peer:
        return _run_peer(args, collect())
    plan = _plan(args)
    environment = collect()
    source = DEFAULT_WORKLOADS if args.workloads else DEFAULT_STRUCTURED if args.structured else args.prompts
    prompts, meta = load_prompts(source, plan.per_kind)
    if args.server:
        from dspark_cli.bench.server import run_server_bench

        rep = run_server_bench(args, plan, prompts, meta, environment)
    else:
        baseline, spec, skipped = load_runtimes(args.model, plan.modes, {"dspark": args.dspark_drafter,
                                                                         "dflash": args.dflash_drafter})
        encoded = core.encode_prompts(prompts, baseline.tokenizer)
        records, summ, _ = core.measure(baseline, spec, encoded, plan, lambda n: ProgressBar(n, "bench"),
                                        kinds={p.id: p.kind for p in prompts})
        rep = core.build_report(records, summ, spec, plan=plan, environment=environment, prompt_meta=meta,
                                target=baseline.info.model_id, command=" ".join(["dspark", *sys.argv[1:]]),
                                skipped=skipped)
    out = write_all(rep, args.out)
    print((out / "report.md").read_text())
    stderr_progress(wrote_message(out, rep["plots"]))
    return 0


def _run_peer(args, environment: dict) -> int:
    from dspark_cli.bench import peer

    rep = peer.run_peer_bench(args, environment)
    rep["command"] = " ".join(["dspark", *sys.argv[1:]])
    out = peer.write(rep, args.out)
    print((out / "report.md").read_text())
    stderr_progress(f"wrote {out}/report.json and report.md")
    return 0


def wrote_message(out: Path, plots: list[str]) -> str:
    """What `write_all` put in `out`, naming only the plots it actually wrote."""
    if not plots:
        return f"wrote {out}/report.json and report.md (no plots: they compare drafter arms, and none ran)"
    return f"wrote {out}/report.json, report.md and {', '.join(plots)}"


def write_all(rep: dict, out: Path) -> Path:
    """report.json, the plots and report.md into `out` (created)."""
    from dspark_cli.bench import plots, report

    out.mkdir(parents=True, exist_ok=True)
    rep["plots"] = plots.write_plots(rep, out)
    report.write_json(rep, out)
    report.write_markdown(rep, out)
    return out
