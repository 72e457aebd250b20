"""Fast BLAS for MLX's Linux CPU backend.

MLX's Linux CPU wheel links a bundled *reference* BLAS (about 3 GFLOP/s for fp32 GEMM). MLX only
takes `cblas_sgemm`/`cblas_dgemm`/`cblas_cgemm` and LAPACK from it, so loading an optimized BLAS with
RTLD_GLOBAL before `import mlx.core` makes MLX bind to it (about 185 GFLOP/s with BLIS on 2 cores).

This module must not import MLX at module level: `ensure_fast_blas()` has to run first. On macOS
(Accelerate) it does nothing.

Environment:
    DSPARK_BLAS=off            do not load any BLAS (use what the MLX wheel ships)
    DSPARK_BLAS=/path/lib.so   load exactly this library
    DSPARK_BLAS_SEARCH=a:b:c   override the candidate list (used by tests)

Thread count: the library starts with one thread per available core (best for prefill), and
`blas_threads(n)` changes it for a stretch of work. Decode rounds multiply a few rows by every
weight matrix; on a 2-core machine BLIS's second thread makes those products slower, not faster
(SmolLM2, 2 rows: 95 ms at 1 thread against 120 ms at 2), so the engine measures which count
decodes faster (`engine.costs`) and decodes with it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

# Debian/Ubuntu multiarch locations; BLIS first (fastest at m=1, see docs), then OpenBLAS.
_MULTIARCH = ("x86_64-linux-gnu", "aarch64-linux-gnu")
_DEFAULT_CANDIDATES = tuple(
    f"/usr/lib/{arch}/{sub}"
    for sub in ("blis-pthread/libblis.so.4", "libblis.so.4", "openblas-pthread/libopenblas.so.0",
                "libopenblas.so.0")
    for arch in _MULTIARCH
)

FIX_HINT = (
    "install an optimized BLAS (Debian/Ubuntu: `apt-get install libblis4-pthread`) and make sure "
    "DSPARK_BLAS is not 'off'"
)


@dataclass
class BlasState:
    """What `ensure_fast_blas` did, for `dspark doctor` and benchmark reports."""

    name: str = "platform default"  # "BLIS", "OpenBLAS", "reference (bundled)", "Accelerate"
    path: str | None = None
    threads: int | None = None
    reason: str = ""
    late: bool = False  # True when mlx.core was imported before we could load the library
    tried: list[str] = field(default_factory=list)


STATE = BlasState()
_done = False
_thread_setter = None  # the loaded library's set-num-threads function, when it has one
_current_threads: int | None = None
_threads_lock = threading.Lock()


def available_cores() -> int:
    """CPU cores this process may run on (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def blas_kind(path: str) -> str:
    """Human name of a BLAS library from its file name."""
    base = os.path.basename(path).lower()
    if "blis" in base:
        return "BLIS"
    if "openblas" in base:
        return "OpenBLAS"
    if "mkl" in base:
        return "MKL"
    return base


def candidate_paths() -> list[str]:
    """Libraries to try in order: DSPARK_BLAS_SEARCH if set, else the Debian multiarch paths."""
    search = os.environ.get("DSPARK_BLAS_SEARCH")
    if search is not None:
        return [p for p in search.split(os.pathsep) if p]
    return list(_DEFAULT_CANDIDATES)


def select_blas(candidates: list[str], exists=os.path.exists) -> str | None:
    """First existing candidate, or None when none is installed."""
    for path in candidates:
        if exists(path):
            return path
    return None


def _set_threads(lib: ctypes.CDLL, kind: str, threads: int) -> None:
    # The env vars are read at library init, but set the count explicitly too in case the
    # library was initialised before we could export them.
    global _thread_setter, _current_threads
    setter = {"BLIS": "bli_thread_set_num_threads", "OpenBLAS": "openblas_set_num_threads"}.get(kind)
    fn = getattr(lib, setter, None) if setter else None
    if fn is not None:
        fn.argtypes = [ctypes.c_long] if kind == "BLIS" else [ctypes.c_int]
        fn(threads)
        _thread_setter, _current_threads = fn, threads


def can_set_threads() -> bool:
    """True when the loaded BLAS lets us change its thread count (BLIS, OpenBLAS)."""
    return _thread_setter is not None


def current_blas_threads() -> int | None:
    """The loaded BLAS's thread count now (None when it is not ours to set)."""
    return _current_threads


def thread_choices() -> list[int]:
    """Thread counts worth timing for decode: 1 and the configured count (one entry if equal)."""
    if not can_set_threads() or not STATE.threads:
        return []
    return sorted({1, STATE.threads})


@contextmanager
def blas_threads(n: int | None):
    """Run the block with the BLAS at ``n`` threads, then restore the previous count.

    A no-op for ``n=None`` or when the BLAS cannot be set. The count is process-wide (BLAS state is
    global), so the engine uses this on its single worker thread only. Results do not depend on it:
    BLIS splits a product by output rows and columns, not along the summed dimension (a test checks
    bit-identical products at 1 and 2 threads).
    """
    global _current_threads
    if n is None or _thread_setter is None or n == _current_threads:
        yield
        return
    with _threads_lock:
        previous = _current_threads
        _thread_setter(n)
        _current_threads = n
    try:
        yield
    finally:
        with _threads_lock:
            _thread_setter(previous)
            _current_threads = previous


def ensure_fast_blas() -> BlasState:
    """Load an optimized BLAS globally before MLX binds to its bundled reference BLAS.

    Idempotent; returns the module-level `STATE`. Never raises: a failure leaves the reference BLAS
    in place and records why, so `dspark doctor` can explain it.
    """
    global _done
    if _done:
        return STATE
    _done = True
    if sys.platform == "darwin":
        STATE.name, STATE.reason = "Accelerate", "macOS: MLX uses Metal/Accelerate"
        return STATE
    if not sys.platform.startswith("linux"):
        STATE.reason = f"no BLAS preloading on {sys.platform}"
        return STATE
    setting = os.environ.get("DSPARK_BLAS", "").strip()
    if setting.lower() in ("off", "0", "none", "false"):
        STATE.name, STATE.reason = "reference (bundled)", "disabled by DSPARK_BLAS=off"
        return STATE
    candidates = [setting] if setting else candidate_paths()
    STATE.tried = candidates
    path = select_blas(candidates)
    if path is None:
        STATE.name = "reference (bundled)"
        STATE.reason = "no optimized BLAS found; " + FIX_HINT
        return STATE
    _load(path)
    return STATE


def configured_threads() -> int:
    """The BLAS thread count to load with: DSPARK_BLAS_THREADS when it is a positive integer (e.g. to
    leave cores to other processes), else the cores this process may run on."""
    setting = os.environ.get("DSPARK_BLAS_THREADS", "").strip()
    return int(setting) if setting.isdigit() and int(setting) > 0 else available_cores()


def _load(path: str) -> None:
    kind = blas_kind(path)
    threads = configured_threads()
    for var in ("BLIS_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))
    STATE.late = "mlx.core" in sys.modules
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        STATE.name, STATE.reason = "reference (bundled)", f"failed to load {path}: {exc}"
        return
    _set_threads(lib, kind, threads)
    STATE.name, STATE.path, STATE.threads = kind, path, threads
    STATE.reason = "loaded before mlx.core" if not STATE.late else "loaded after mlx.core (may not bind)"


def mapped_blas_libraries() -> list[str]:
    """Shared libraries mapped into this process whose name looks like a BLAS (Linux only)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if line.rstrip().endswith(".so") or ".so." in line}
    except OSError:
        return []
    keys = ("blas", "blis", "mkl")
    return sorted(p for p in paths if any(k in os.path.basename(p).lower() for k in keys))


def measure_sgemm_gflops(n: int = 1024, repeats: int = 5) -> float:
    """Best-of-`repeats` fp32 n x n x n matmul throughput in GFLOP/s on the default device."""
    import mlx.core as mx

    a = mx.random.normal((n, n), key=mx.random.key(0))
    b = mx.random.normal((n, n), key=mx.random.key(1))
    mx.eval(a, b, a @ b)  # warm-up: first call pays for thread start-up and packing buffers
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def platform_summary() -> dict:
    """Platform, MLX version/device and BLAS facts for doctor output and benchmark reports."""
    import mlx.core as mx

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "cores": available_cores(),
        "blas": STATE.name,
        "blas_path": STATE.path,
        "blas_threads": STATE.threads,
        "blas_reason": STATE.reason,
    }
