"""`dspark bench --peer LLAMA_BENCH`: plain decoding and prefill beside llama.cpp, on the same GGUF.

For each thread count, interleaved so that drift hits both sides alike:

- decode: our plain greedy decode of one prompt (`--max-tokens`, default 128) against llama-bench's
  text generation of as many tokens after a context of the same length (`-n N -d depth`: llama-bench
  takes no prompt text; what is in the context does not change the speed);
- prefill: a prompt of each `--peer-prefill` length through our engine against llama-bench's
  prompt processing of as many tokens (`-p N`).

llama.cpp runs each test with repacked weights (its fastest CPU layout) unless that fails on this
machine (here, llama-bench 0c1e570's repacked weights crash once there is a context); that test then
runs `--repack 0`, and the report says which setting each row used. Our side runs the engine's default precision (`--precision auto`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dspark_cli.progress import stderr_progress

DEFAULT_PREFILL = (512, 4096)
# A code prompt that the default model answers at length (its greedy answer does not stop early).
DECODE_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test."
PEER_TIMEOUT_S = 1800


@dataclass(frozen=True)
class PeerRun:
    """What llama-bench reported for one test: tokens/s over its repetitions, and how it ran."""

    tokens_per_s: float
    samples: tuple[float, ...]
    repack: bool
    info: dict


def llama_bench(binary: Path, gguf: Path, args: list[str], repack: bool) -> list[dict]:
    """Run llama-bench with `args` and JSON output; its result records. Raises RuntimeError on failure
    (a signal included: llama.cpp's repacked kernels trap on some VMs)."""
    command = [str(binary), "-m", str(gguf), "-o", "json", "--repack", "1" if repack else "0", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=PEER_TIMEOUT_S)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}: {' | '.join(tail)}")
    return json.loads(done.stdout)


class Peer:
    """llama-bench on one GGUF, with repacked weights for each test where they run here."""

    def __init__(self, binary: Path, gguf: Path, repeats: int):
        self.binary, self.gguf, self.repeats = binary, gguf, repeats
        self.notes: list[str] = []

    def run(self, threads: int, args: list[str]) -> PeerRun:
        """One llama-bench test at `threads` threads (`args`: -p/-n/-d), `repeats` repetitions:
        repacked weights first, and `--repack 0` (noted) if those fail on this test."""
        full = ["-t", str(threads), "-r", str(self.repeats), *args]
        try:
            record, repack = llama_bench(self.binary, self.gguf, full, repack=True)[0], True
        except RuntimeError as e:
            self.notes.append(f"repacked weights failed, so this test ran with --repack 0: {e}")
            record, repack = llama_bench(self.binary, self.gguf, full, repack=False)[0], False
        info = {k: record.get(k) for k in ("build_commit", "build_number", "cpu_info", "backends", "model_type",
                                           "model_size", "type_k", "n_batch", "n_ubatch")}
        return PeerRun(float(record["avg_ts"]), tuple(record.get("samples_ts") or ()), repack, info)


def ours_decode(runtime, prompt_ids: list[int], max_tokens: int, repeats: int) -> tuple[float, list[float], int]:
    """(median decode tokens/s, every run's, tokens decoded in the last run) of plain greedy decoding."""
    from dspark_cli.bench.arms import timed_greedy

    rates, tokens = [], 0
    for _ in range(repeats):
        _, finished, _ = timed_greedy(runtime, prompt_ids, max_tokens)
        s = finished.stats
        tokens = s.round_tokens
        rates.append(s.round_tokens / s.decode_time_s if s.decode_time_s > 0 else float("nan"))
    return statistics.median(rates), rates, tokens


def ours_prefill(runtime, prompt_ids: list[int], repeats: int) -> tuple[float, list[float]]:
    """(median prefill tokens/s, every run's) of `prompt_ids` (one new token after each)."""
    from dspark_cli.bench.arms import timed_greedy

    rates = []
    for _ in range(repeats):
        _, finished, _ = timed_greedy(runtime, prompt_ids, 1)
        rates.append(len(prompt_ids) / finished.stats.time_prefill_s)
    return statistics.median(rates), rates


def filler_ids(ids: list[int], n: int) -> list[int]:
    """n prompt ids: `ids` repeated. Prefill speed depends on how many tokens there are, not on what
    they say (llama-bench's own prompts are random ids)."""
    return (ids * (n // len(ids) + 1))[:n]


def run_peer_bench(args, environment: dict) -> dict:
    """The side-by-side report: decode and prefill, ours against llama-bench, per thread count."""
    from engine import backend
    from engine.api import EngineConfig, SpecConfig
    from engine.loading.default_model import obtain_gguf
    from engine.runtime import build_runtime
    from engine.text import apply_chat_template

    binary = Path(args.peer)
    if not binary.is_file():
        raise SystemExit(f"dspark bench --peer: {binary} is not a file (pass the path of llama.cpp's llama-bench)")
    if args.model is not None and args.peer_gguf is None:
        raise SystemExit("dspark bench --peer with --model: pass --peer-gguf, the GGUF of the same model")
    gguf = Path(args.peer_gguf) if args.peer_gguf else obtain_gguf(stderr_progress)
    repeats = args.repeats or 3
    max_tokens = args.max_tokens or 128
    runtime = build_runtime(EngineConfig(model=args.model, spec=SpecConfig(mode="baseline")), stderr_progress)
    prompt = apply_chat_template(runtime.tokenizer, [{"role": "user", "content": DECODE_PROMPT}])
    peer = Peer(binary, gguf, repeats)
    rows = []
    for threads in args.peer_threads:
        with backend.blas_threads(threads):
            stderr_progress(f"decode, {threads} thread(s): llama.cpp, then ours")
            theirs = peer.run(threads, ["-p", "0", "-n", str(max_tokens), "-d", str(len(prompt))])
            ours, runs, tokens = ours_decode(runtime, prompt, max_tokens, repeats)
            rows.append(_row("decode", threads, len(prompt), tokens, ours, runs, theirs))
            for n in args.peer_prefill:
                stderr_progress(f"prefill {n} tokens, {threads} thread(s): llama.cpp, then ours")
                theirs = peer.run(threads, ["-p", str(n), "-n", "0"])
                ours, runs = ours_prefill(runtime, filler_ids(prompt, n), max(1, repeats if n <= 1024 else 1))
                rows.append(_row("prefill", threads, n, 0, ours, runs, theirs))
    return {"kind": "peer", "peer": "llama.cpp llama-bench", "peer_binary": str(binary), "gguf": str(gguf),
            "model": runtime.info.model_id, "precision": environment.get("precision"),
            "notes": peer.notes, "repeats": repeats, "rows": rows,
            "environment": environment}


def _row(test: str, threads: int, prompt_tokens: int, tokens: int, ours: float, runs: list[float],
         theirs: PeerRun) -> dict:
    return {"test": test, "threads": threads, "prompt_tokens": prompt_tokens, "decoded_tokens": tokens,
            "ours_tokens_per_s": round(ours, 2), "ours_runs": [round(r, 2) for r in runs],
            "peer_tokens_per_s": round(theirs.tokens_per_s, 2), "peer_runs": [round(r, 2) for r in theirs.samples],
            "ratio": round(ours / theirs.tokens_per_s, 3), "peer_repack": theirs.repack, "peer_info": theirs.info}


def markdown(rep: dict) -> str:
    """report.md of a peer run: the table, how each side ran, and the machine."""
    env = rep["environment"]
    lines = [f"# dspark-serve beside {rep['peer']}", "",
             f"Model `{rep['model']}` (ours at precision `{rep['precision']}`), GGUF `{rep['gguf']}`; "
             f"medians of {rep['repeats']} runs (ours), llama-bench's mean of as many (theirs).", "",
             "| test | threads | tokens | ours tok/s | llama.cpp tok/s | llama.cpp weights | ours / llama.cpp |",
             "|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        size = f"{r['decoded_tokens']} after {r['prompt_tokens']}" if r["test"] == "decode" else str(r["prompt_tokens"])
        weights = "repacked" if r["peer_repack"] else "--repack 0"
        lines.append(f"| {r['test']} | {r['threads']} | {size} | {r['ours_tokens_per_s']} | "
                     f"{r['peer_tokens_per_s']} | {weights} | x{r['ratio']} |")
    lines += ["", *[f"- {n}" for n in rep["notes"]]]
    info = rep["rows"][0]["peer_info"] if rep["rows"] else {}
    lines += [f"- llama.cpp build {info.get('build_number')} ({info.get('build_commit')}), {info.get('cpu_info')}",
              f"- ours: MLX {env.get('mlx')} on {env.get('device')}, BLAS {env.get('blas')}, {env.get('native')}",
              f"- command: `{rep.get('command', '')}`"]
    return "\n".join(lines) + "\n"


def write(rep: dict, out: Path) -> Path:
    """report.json and report.md of a peer run into `out` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
    (out / "report.md").write_text(markdown(rep))
    return out
