"""Time engine/native's skinny_linear against MLX's matmul (docs/native.md has the numbers).

Three measurements, each the median (forward, decode) or minimum (matrix) of repeated runs, printed
with the BLAS and kernel build in use:
  1. the tied lm_head shape [49152, 576] at 1-16 rows, cycling six such matrices (678 MB) so the
     weights come from memory, not from a large last-level cache;
  2. the default model's whole forward of 1/2/4/8 new tokens after 128 cached ones, with MLX's
     linears, then with every linear (and the tied lm_head) routed through each kernel;
  3. plain greedy decode speed on MLX's path and routed through the panel kernel, interleaved.

Run pinned to one core with one BLAS thread, as the bench runs: see docs/native.md for the command.
"""

from __future__ import annotations

import argparse
import time

import engine  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from engine import backend
from engine.loading.target import load_target
from engine.native import REASON, load, pack_panels
from engine.native.linear import PackedLinear, route_linears


def matrix_table(ext, threads: int) -> None:
    ws = [mx.random.normal((49152, 576)) for _ in range(6)]
    packed = [pack_panels(w) for w in ws]
    mx.eval(ws, packed)

    def best(f, mats, reps=8):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            mx.eval([f(w) for w in mats])
            times.append(time.perf_counter() - t0)
        return 1000 * min(times) / len(mats)

    print("lm_head [49152, 576], ms per matrix: rows | mlx | native dot | native packed")
    for rows in (1, 2, 4, 8, 16):
        x = mx.random.normal((1, rows, 576))
        mx.eval(x)
        mlx_ms = best(lambda w, x=x: x @ w.T, ws)
        dot_ms = best(lambda w, x=x: ext.skinny_linear(x, w, threads), ws)
        packed_ms = best(lambda wp, x=x: ext.packed_linear(x, wp, 49152, threads), packed)
        print(f"{rows} | {mlx_ms:.2f} | {dot_ms:.2f} | {packed_ms:.2f}")


class DotLinear(nn.Module):
    """A bias-free linear through the dot-product kernel (skinny_linear) on w as it is."""

    def __init__(self, weight: mx.array, ext):
        super().__init__()
        self.weight, self._ext = weight, ext

    def __call__(self, x):
        return self._ext.skinny_linear(x, self.weight, backend.current_blas_threads() or 1)


def forward_table(ext, threads: int) -> None:
    model = load_target(None, precision="float32")[0]

    def median(rows, reps=12):
        times = []
        for _ in range(reps):
            cache = make_prompt_cache(model)
            mx.eval(model(mx.array([list(range(10, 138))]), cache=cache))
            t0 = time.perf_counter()
            mx.eval(model(mx.array([list(range(200, 200 + rows))]), cache=cache))
            times.append(time.perf_counter() - t0)
        return 1000 * sorted(times)[len(times) // 2]

    widths = (1, 2, 4, 8)
    results = {"mlx": {r: median(r) for r in widths}}
    for name, make in (("native dot", DotLinear), ("native packed", PackedLinear)):
        model = load_target(None, precision="float32")[0]  # a fresh copy: `median` times whichever `model` is current
        route_linears(model, ext, make)
        with backend.blas_threads(threads):  # the routed kernels run at the BLAS's thread count, as served
            results[name] = {r: median(r) for r in widths}
    base = results["mlx"][1]
    print("whole forward after 128 tokens, ms (ratio to MLX at 1 token): tokens | " + " | ".join(results))
    for r in widths:
        print(f"{r} | " + " | ".join(f"{res[r]:.1f} ({res[r] / base:.2f})" for res in results.values()))


def decode_table(ext, tokens: int = 64, reps: int = 3) -> None:
    """Plain greedy decode (mlx-lm's generate_step) of the default model on MLX's path and routed
    through the panel kernel (engine.native.linear, as DSPARK_NATIVE=1 does), interleaved."""
    from mlx_lm.generate import generate_step

    mlx_model, tok = load_target(None, precision="float32")[:2]
    routed = load_target(None, precision="float32")[0]
    route_linears(routed, ext)
    prompt = mx.array(tok.apply_chat_template([{"role": "user", "content": "Explain how a hash map works."}],
                                              add_generation_prompt=True))
    times: dict[str, list[float]] = {"mlx": [], "native packed": []}
    outputs = {}
    for _ in range(reps):
        for name, model in (("mlx", mlx_model), ("native packed", routed)):
            steps = generate_step(prompt, model, max_tokens=tokens, sampler=lambda x: mx.argmax(x, axis=-1))
            first = next(steps)
            t0 = time.perf_counter()
            rest = [int(t) for t, _ in steps]
            times[name].append((tokens - 1) / (time.perf_counter() - t0))
            outputs[name] = [int(first[0])] + rest
    print(f"plain greedy decode, {tokens} tokens after a chat prompt, tokens/s (median of {reps}): "
          + ", ".join(f"{k} {sorted(v)[len(v) // 2]:.1f}" for k, v in times.items())
          + f"; same tokens: {outputs['mlx'] == outputs['native packed']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="kernel threads (default 1; the routed forwards also set the BLAS to it)")
    args = parser.parse_args()
    ext = load()
    if ext is None:
        raise SystemExit(REASON)
    print(f"BLAS: {backend.STATE.name} at {backend.current_blas_threads()} threads, sgemm 1024^3 "
          f"{backend.measure_sgemm_gflops():.1f} GFLOP/s; kernel: {ext.instruction_set()}, {args.threads} threads")
    matrix_table(ext, args.threads)
    forward_table(ext, args.threads)
    decode_table(ext)


if __name__ == "__main__":
    main()
