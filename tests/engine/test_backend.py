"""The BLAS loader: BLIS when present, clean fallback when absent, and the doctor report."""

import json
import os
import subprocess
import sys

import pytest

from engine import backend
from tests.cpu_pinning import machine_cores

BLIS = "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4"


def _doctor(env_extra: dict) -> dict:
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-m", "dspark_cli.main", "doctor", "--json"],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    return json.loads(out.stdout)


def test_select_blas_prefers_first_existing():
    """select_blas returns the first candidate that exists, None when none does."""
    present = {"/b/libopenblas.so.0", "/a/libblis.so.4"}
    cands = ["/x/libblis.so.4", "/a/libblis.so.4", "/b/libopenblas.so.0"]
    assert backend.select_blas(cands, exists=present.__contains__) == "/a/libblis.so.4"
    assert backend.select_blas(cands[:1], exists=present.__contains__) is None
    assert backend.blas_kind("/b/libopenblas.so.0") == "OpenBLAS"


@pytest.mark.skipif(not os.path.exists(BLIS), reason="BLIS not installed (make test installs it on Debian)")
def test_blis_chosen_and_bound_when_present():
    """With BLIS installed, a fresh process loads it before MLX and doctor reports it."""
    info = _doctor({})
    assert info["blas"] == "BLIS" and info["blas_path"] == BLIS
    assert any("libblis" in p for p in info["mapped_blas"])
    # A busy CPU (the other test worker) can slow the sgemm measurement; it must not be blamed on the BLAS.
    assert not any("reference BLAS" in w for w in info["warnings"]), info["warnings"]


def test_slow_measurement_with_blis_bound_blames_the_load_not_the_blas():
    """doctor's diagnosis of a slow sgemm: the reference BLAS only when no optimized one is mapped."""
    from dspark_cli.doctor import warnings

    base = {"sgemm_gflops": 5.0, "blas": "BLIS", "blas_reason": "loaded", "device": "Device(cpu, 0)"}
    busy = warnings({**base, "mapped_blas": [BLIS]})
    reference = warnings({**base, "blas": "reference (bundled)", "mapped_blas": []})
    if sys.platform.startswith("linux"):
        assert len(busy) == 1 and "busy" in busy[0] and "reference" not in busy[0]
        assert len(reference) == 1 and "reference BLAS" in reference[0]
    assert warnings({**base, "sgemm_gflops": 90.0, "mapped_blas": [BLIS]}) == []


def test_fallback_when_no_blas_is_installed():
    """With no candidate present, MLX still works on its bundled BLAS and doctor warns with the fix."""
    info = _doctor({"DSPARK_BLAS_SEARCH": "/nonexistent/libblis.so.4"})
    assert info["blas"] == "reference (bundled)"
    assert not any("libblis" in p for p in info["mapped_blas"])
    assert info["sgemm_gflops"] > 0
    assert info["warnings"] and "libblis4-pthread" in info["warnings"][0]


def test_disable_switch():
    """DSPARK_BLAS=off leaves the bundled BLAS in place and says why."""
    code = "import engine.backend as b, engine; print(b.STATE.name, '|', b.STATE.reason)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "DSPARK_BLAS": "off"}).stdout
    assert out.strip() == "reference (bundled) | disabled by DSPARK_BLAS=off"


needs_threads = pytest.mark.skipif(not backend.can_set_threads() or machine_cores() < 2,
                                   reason="needs a BLAS whose thread count we set, on >= 2 cores")


@needs_threads
def test_blas_threads_sets_and_restores():
    """blas_threads(n) holds n inside the block and restores the loaded count after it, also on error."""
    loaded = backend.current_blas_threads()
    other = 2 if loaded == 1 else 1  # the suite's workers load one thread each (tests/conftest.py)
    with backend.blas_threads(other):
        assert backend.current_blas_threads() == other
    assert backend.current_blas_threads() == loaded
    with pytest.raises(RuntimeError), backend.blas_threads(other):
        raise RuntimeError("boom")
    assert backend.current_blas_threads() == loaded
    with backend.blas_threads(None):  # None: leave the BLAS as loaded
        assert backend.current_blas_threads() == loaded
    assert backend.thread_choices() == sorted({1, loaded})


def test_blas_thread_count_from_the_environment():
    """DSPARK_BLAS_THREADS sets the loaded count; anything but a positive integer falls back to the cores."""
    code = "import engine.backend as b, engine; print(b.STATE.name, b.STATE.threads, b.available_cores())"
    for setting, want in (("1", "1"), ("3", "3"), ("0", None), ("two", None)):
        env = {**os.environ, "DSPARK_BLAS_THREADS": setting}
        name, threads, cores = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                              check=True, env=env).stdout.split()
        if name in ("BLIS", "OpenBLAS"):
            assert threads == (want or cores), setting


@needs_threads
def test_products_do_not_depend_on_thread_count():
    """Decode at 1 thread must give bit-identical logits to 2 threads (lossless greedy relies on it)."""
    import mlx.core as mx

    mx.random.seed(0)
    for n_out, k in ((1536, 576), (49152, 576)):
        w = mx.random.normal((n_out, k))
        for m in (2, 8, 300):
            x = mx.random.normal((m, k))
            with backend.blas_threads(1):
                one = x @ w.T
                mx.eval(one)
            with backend.blas_threads(2):
                many = x @ w.T
                mx.eval(many)
            assert mx.array_equal(one, many).item(), (n_out, k, m)
