"""`dspark doctor`: platform, MLX device, which BLAS is bound, and measured sgemm speed."""

from __future__ import annotations

import json
import sys

# Below this the reference BLAS is almost certainly in use (it gives about 3 GFLOP/s; BLIS ~185).
SLOW_GFLOPS = 20.0


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="check the platform, the BLAS MLX uses and its speed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def collect() -> dict:
    """Facts for the report, including a fresh sgemm measurement."""
    from engine import backend
    from engine.native.cpu import wider_units

    info = backend.platform_summary()
    info["mapped_blas"] = backend.mapped_blas_libraries()
    info["sgemm_gflops"] = round(backend.measure_sgemm_gflops(), 1)
    info["native"] = native_path()
    info["wider_units"] = wider_units()  # the CPU's units wider than AVX-512F, and why they are unused
    info["precision"] = default_precision()
    info["warnings"] = warnings(info)
    return info


def default_precision() -> str:
    """Which weights the embedded default model is served with (`--precision auto`)."""
    from engine.loading.target import resolve_precision

    chosen = resolve_precision("auto")
    why = ("its GGUF's 4/8-bit tensors, through the native kernel" if chosen == "stored"
           else "dequantized once: without the native kernel, MLX's quantized products are the slower path here")
    return f"{chosen} ({why}; --precision picks another)"


def default_model_memory() -> str:
    """The embedded default model's weight memory as `--precision auto` loads it (loaded here, if prepared)."""
    import mlx.core as mx

    from engine.loading.default_model import default_model_dir, is_prepared
    from engine.loading.target import load_target, resolve_precision, weight_bytes

    precision = resolve_precision("auto")
    if not is_prepared(default_model_dir(precision)):
        return f"not prepared at {precision} precision yet (`dspark prepare` converts it)"
    before = mx.get_active_memory()
    model, _, _ = load_target(None, precision=precision)
    held = mx.get_active_memory() - before
    return (f"{weight_bytes(model) / 1e6:.1f} MB of weights at {precision} precision "
            f"(MLX holds {held / 1e6:.1f} MB more once it is loaded)")


def native_path() -> str:
    """Which path the target's linears take: the native panel kernel or MLX's (and why)."""
    from engine import native
    from engine.native.linear import requested

    ext = native.load()
    asked = requested()
    if asked is False:
        built = f"built ({ext.instruction_set()})" if ext is not None else "not built"
        return f"MLX's (DSPARK_NATIVE=0; the native kernel is {built})"
    if ext is None:
        return f"MLX's: {'DSPARK_NATIVE=1 but ' if asked else ''}{native.REASON}"
    if asked is None:
        return (f"MLX's for float32 products (DSPARK_NATIVE=1 routes them too), native panel kernel "
                f"({ext.instruction_set()}) for quantized ones (--precision stored)")
    return f"native panel kernel ({ext.instruction_set()}), DSPARK_NATIVE=1"


def warnings(info: dict) -> list[str]:
    """Human-readable problems with their fixes."""
    from engine.backend import FIX_HINT

    out = []
    slow = sys.platform.startswith("linux") and info["sgemm_gflops"] < SLOW_GFLOPS
    optimized = [p for p in info["mapped_blas"] if "libblis" in p or "openblas" in p]
    if slow and optimized:
        # The fast BLAS is bound, so the measurement ran on a busy CPU (other processes, or the
        # other tests of a parallel run): say that, not that the BLAS is wrong.
        out.append(f"sgemm runs at {info['sgemm_gflops']} GFLOP/s although {info['blas']} is loaded: the CPU "
                   "was probably busy; measure again on a quiet machine.")
    elif slow:
        out.append(
            f"sgemm runs at {info['sgemm_gflops']} GFLOP/s: MLX is using the slow reference BLAS "
            f"({info['blas_reason']}). Fix: {FIX_HINT}."
        )
    if info["device"].startswith("Device(cpu") and sys.platform == "darwin":
        out.append("MLX runs on the CPU on macOS; Metal should be available on Apple Silicon.")
    return out


def run(args) -> int:
    info = collect()
    # Here, not in collect(): it loads the model, and `dspark bench` collects the same facts.
    info["memory"] = default_model_memory()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rows = [
        ("platform", info["platform"]),
        ("python", info["python"]),
        ("mlx", f"{info['mlx']} on {info['device']}"),
        ("cores", info["cores"]),
        ("blas", f"{info['blas']}" + (f" ({info['blas_path']}, {info['blas_threads']} threads)" if info["blas_path"] else "")),
        ("blas note", info["blas_reason"]),
        ("sgemm 1024^3 fp32", f"{info['sgemm_gflops']} GFLOP/s"),
        ("linear path", info["native"]),
        ("wider units", info["wider_units"]),
        ("default model", info["precision"]),
        ("its memory", info["memory"]),
    ]
    for key, value in rows:
        print(f"{key:>18}: {value}")
    for warning in info["warnings"]:
        print(f"WARNING: {warning}", file=sys.stderr)
    return 0
