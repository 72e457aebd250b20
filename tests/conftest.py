"""Shared fixtures. Importing `engine` first loads the fast BLAS before anything imports MLX."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test may reach a model hub
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Several test processes (and the servers they start, which inherit this) share the cores; a BLAS
    # with a thread per core in each oversubscribes them, and its threads then wait on each other.
    os.environ.setdefault("DSPARK_BLAS_THREADS", "1")

from tests.cpu_pinning import pin_this_worker  # noqa: E402

pin_this_worker()  # before MLX starts its threads

import engine  # noqa: E402,F401
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def default_model_dir():
    """The converted SmolLM2-135M-Instruct directory `dspark serve` loads here (--precision auto:
    its stored 4/8-bit tensors where the native kernel multiplies them, else float32), prepared by
    the test command's bootstrap."""
    from engine.loading.default_model import default_model_dir, is_prepared
    from engine.loading.target import resolve_precision

    path = default_model_dir(resolve_precision("auto"))
    if not is_prepared(path):
        pytest.fail(f"default model not prepared at {path}: run `dspark prepare` (`make test` does it)")
    return path


@pytest.fixture(scope="session")
def float32_model_dir():
    """The default model converted to float32, for tests about that conversion and MLX's float32
    path (converted here once if the bootstrap prepared the stored one only)."""
    from engine.loading.default_model import ensure_default_model

    return ensure_default_model(precision="float32")


@pytest.fixture(scope="session")
def default_target(default_model_dir):
    """(model, tokenizer) of the default model, float32, loaded once per session."""
    from engine.loading.target import load_target

    model, tokenizer, _ = load_target(str(default_model_dir))
    return model, tokenizer


@pytest.fixture(scope="session")
def default_server(default_model_dir, tmp_path_factory, worker_id):
    """`dspark serve` over the default model in its default mode, one for the whole run: every
    xdist worker attaches to the same server (tests/real_server.py, `shared_server`)."""
    from tests.real_server import shared_server
    from tests.server.conftest import free_port

    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent  # workers' base temps share a parent
    with shared_server(root, free_port) as server:
        yield server


# The files that run longest (seconds of one core on 2026-12-07, heaviest first). They start first,
# so that neither xdist worker is left running a long file alone at the end (pyproject.toml turns
# off xdist's own order, by test count). A stale list costs balance only, never a result.
SLOWEST_FILES = [
    "tests/server/test_contract.py",  # 153
    "tests/engine/test_lossless.py",  # 106
    "tests/engine/test_smollm2_structured.py",  # 89
    "tests/engine/test_smollm2_spec.py",  # 86
    "tests/engine/test_smollm2_seed_stable.py",  # 67
    "tests/engine/test_lossless_grammar.py",  # 61
    "tests/engine/test_gemma_target.py",  # 37
    "tests/engine/test_smollm2_processors.py",  # 34
    "tests/server/test_page_browser.py",  # 33
    "tests/engine/test_lookup_smollm2.py",  # 33
    "tests/engine/test_lossless_processors.py",  # 33
    "tests/server/test_structured.py",  # 31
    "tests/engine/test_hybrid_lossless.py",  # 30
    "tests/engine/test_gemma_lossless.py",  # 29
    "tests/engine/test_sampling.py",  # 27
]


def pytest_collection_modifyitems(session, config, items):
    """Put the slowest files first (a stable sort: every other test keeps its place)."""
    rank = {path: i for i, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


_exit_status = {"code": 0}


def pytest_sessionfinish(session, exitstatus):
    _exit_status["code"] = int(exitstatus)


def pytest_unconfigure(config):
    """Exit without C++ static destructors: MLX used on worker threads can abort at exit (mlx#3126)."""
    from dspark_cli.process import exit_process

    exit_process(_exit_status["code"])
