"""Prefix cache on the default model (SmolLM2-135M): multi-turn outputs with the cache on and off,
and the first-token time of a cold first turn against a warm second turn.

    python scripts/prefix_cache_check.py equivalence --conversations 10 --turns 4 --out report.json
    python scripts/prefix_cache_check.py ttft --conversations 5 --out ttft.json

`equivalence`: greedy and seed-stable (temperature 1, seeded) conversations in baseline, dspark and
dflash modes (random SmolLM2-shaped drafters: the restore path, not the acceptance, is what is
checked), each run with the cache on and off; a greedy divergence counts as a tie when the target's
top-2 logit gap there is <= 1e-4 (the rule of tests/engine/test_smollm2_spec.py).
`ttft`: a ~1,500-token system prompt; turn 1 cold, turn 2 resends it and the first exchange.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401  (fast BLAS before mlx.core)
import mlx.core as mx  # noqa: E402

from engine.api import EngineInfo, Finished, GenerationRequest, SamplingParams, SpecConfig  # noqa: E402
from engine.backend import STATE as BLAS  # noqa: E402
from engine.generate import stream_generate  # noqa: E402
from engine.loading.target import load_target  # noqa: E402
from engine.models.drafter import Drafter  # noqa: E402
from engine.models.drafter_config import normalize_drafter_config  # noqa: E402
from engine.models.target import Target  # noqa: E402
from engine.prefix_cache import prefix_cache_for  # noqa: E402
from engine.runtime import Runtime, eos_ids  # noqa: E402
from engine.scheduler import Scheduler  # noqa: E402
from engine.text import apply_chat_template  # noqa: E402
from tests.engine.smollm2_cases import QUESTIONS, geometry_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIE_EPS = 1e-4
FOLLOW_UPS = ["Can you say more?", "Give an example.", "Summarize that in one line.", "Why?"]


def runtime(model, tok, mode: str, cache_bytes: int) -> Runtime:
    """A runtime over the loaded model: baseline, or a random SmolLM2-shaped DSpark/DFlash drafter at cap 4."""
    target, drafter = Target(model), None
    if mode in ("dspark", "dflash"):
        target = Target(model, (2, 14, 26))
        mx.random.seed(5)
        drafter = Drafter(normalize_drafter_config(geometry_config(mode)))
        if drafter.needs_target_binding:
            drafter.bind_target_model(model)
        mx.eval(drafter.parameters())
    info = EngineInfo(model_id="smollm2", model_path="-", mode=mode, drafter=None, cap=4, context_length=8192,
                      sampler="rejection")
    rt = Runtime(target, drafter, tok, info, eos_ids(tok), SpecConfig(mode=mode, max_draft=4),
                 prefix_cache=prefix_cache_for(target, cache_bytes))
    rt.make_scheduler = lambda: Scheduler(4) if drafter is not None else None
    return rt, target


def run(rt: Runtime, prompt: list[int], max_tokens: int, sampling: SamplingParams) -> tuple[list[int], str, float, Finished]:
    """(ids, text, seconds to the first token, Finished) of one request."""
    t0, ttft, ids, text = time.perf_counter(), None, [], []
    for event in stream_generate(rt, GenerationRequest("c", tuple(prompt), max_tokens, sampling)):
        if isinstance(event, Finished):
            return ids, "".join(text) + event.text, ttft, event
        ttft = ttft if ttft is not None else time.perf_counter() - t0
        ids += event.token_ids
        text.append(event.text)
    raise AssertionError("no Finished")


def conversation(rt, tok, system: str, question: str, turns: int, max_tokens: int, sampling: SamplingParams):
    """Each turn's (prompt ids, output ids, ttft, cached tokens)."""
    messages, out = [{"role": "system", "content": system}, {"role": "user", "content": question}], []
    for turn in range(turns):
        prompt = apply_chat_template(tok, messages)
        ids, text, ttft, fin = run(rt, prompt, max_tokens, sampling)
        out.append((prompt, ids, ttft, fin.usage.cached_tokens))
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": FOLLOW_UPS[turn % 4]}]
    return out


def tie_gap(model, context: list[int]) -> float:
    top = mx.sort(model(mx.array([context]))[0, -1])[-2:].tolist()
    return top[1] - top[0]


def equivalence(args, model, tok) -> dict:
    system = "You are a helpful assistant. Answer briefly and precisely."
    report = {"modes": {}}
    for mode in ("baseline", "dspark", "dflash"):
        rows = {"greedy_identical": 0, "greedy_ties": [], "greedy_other": [], "seeded_identical": 0,
                "seeded_different": [], "turns": 0, "cached_tokens": 0, "prompt_tokens": 0}
        for label, sampling in (("greedy", SamplingParams()),
                                ("seeded", SamplingParams(temperature=1.0, seed=11, sampler="seed-stable"))):
            for c in range(args.conversations):
                q = QUESTIONS[c % len(QUESTIONS)]
                results = []
                for cache_bytes in (0, 2**30):
                    rt, target = runtime(model, tok, mode, cache_bytes)
                    results.append(conversation(rt, tok, system, q, args.turns, args.max_tokens, sampling))
                    target._uninstall()
                for turn, (cold, warm) in enumerate(zip(*results)):
                    if label == "greedy":
                        rows["turns"] += 1
                        rows["cached_tokens"] += warm[3]
                        rows["prompt_tokens"] += len(warm[0])
                    if cold[0] != warm[0]:  # an earlier turn diverged at a tie: the prompts differ
                        break
                    if cold[1] == warm[1]:
                        rows[f"{label}_identical"] += 1
                        continue
                    k = next(i for i, (a, b) in enumerate(zip(cold[1] + [-1], warm[1] + [-2])) if a != b)
                    if label == "seeded":
                        rows["seeded_different"].append((c, turn, k))
                        continue
                    gap = tie_gap(model, cold[0] + cold[1][:k])
                    rows["greedy_ties" if gap <= TIE_EPS else "greedy_other"].append((c, turn, k, gap))
                print(mode, label, c, rows[f"{label}_identical"], flush=True)
        report["modes"][mode] = rows
        args.out.write_text(json.dumps(report, indent=1, default=str))  # each mode as it ends
    return report


def ttft(args, model, tok) -> dict:
    text = (ROOT / "tests" / "data" / "python_docs_controlflow.txt").read_text()
    reference = tok.decode((tok.encode(text) * 2)[:1480])
    rt, _ = runtime(model, tok, "baseline", 2**30)
    rows = []
    for c in range(args.conversations):
        # Each conversation's system prompt starts differently, so that its first turn is cold.
        system = f"Session {c}. Answer questions about this reference.\n\n{reference}"
        q = QUESTIONS[c % len(QUESTIONS)]
        turns = conversation(rt, tok, system, q, 2, args.max_tokens, SamplingParams())
        (p1, _, t1, c1), (p2, _, t2, c2) = turns
        rows.append({"turn1_prompt": len(p1), "turn1_ttft_s": t1, "turn1_cached": c1,
                     "turn2_prompt": len(p2), "turn2_ttft_s": t2, "turn2_cached": c2,
                     "speedup": t1 / t2, "cached_fraction": c2 / len(p2)})
        print(json.dumps(rows[-1]), flush=True)
    return {"rows": rows, "median_turn1_ttft_s": statistics.median(r["turn1_ttft_s"] for r in rows),
            "median_turn2_ttft_s": statistics.median(r["turn2_ttft_s"] for r in rows),
            "median_speedup": statistics.median(r["speedup"] for r in rows),
            "min_cached_fraction": min(r["cached_fraction"] for r in rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["equivalence", "ttft"])
    p.add_argument("--conversations", type=int, default=10)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    model, tok, _ = load_target(None)
    result = (equivalence if args.what == "equivalence" else ttft)(args, model, tok)
    result |= {"blas": BLAS.name, "blas_threads": BLAS.threads, "mlx": mx.__version__, "args": vars(args) | {"out": str(args.out)}}
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "modes")}, default=str))


if __name__ == "__main__":
    main()
