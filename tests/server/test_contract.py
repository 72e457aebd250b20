"""The API contract: `/openapi.json` describes what the server accepts and returns, in either policy.

Schemathesis (pinned in the `test` extra) tests the server from its own schema, with every check:
no 5xx, responses (SSE events included) and statuses as documented, schema-invalid bodies refused,
schema-valid bodies served. Hooks (`contract_hooks.py`) keep completions a few tokens long.

- Over the FakeEngine under real uvicorn: all phases (examples, coverage, fuzzing, stateful), both
  policies. Seconds. The fake's context window is larger than any body, because the window is a rule
  of the model and its tokenizer that JSON Schema cannot state; its vocabulary bounds token ids.
- Against `dspark serve` on the default model (slow): fuzzing and stateful phases, a smaller budget,
  both policies. A long prompt takes seconds of CPU prefill, so the budget stays small and the
  strings and arrays of valid bodies are cut short (`REAL_MAX_CHARS`).

`make contract` runs both with larger budgets (`DSPARK_CONTRACT_EXAMPLES`, `DSPARK_CONTRACT_REAL_EXAMPLES`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from typing import Any
from pathlib import Path

import httpx
import pytest

from tests.real_server import ServeProcess
from tests.server.conftest import CHAT, COMPLETIONS, free_port, live_server
from tests.server.fake_engine import IMAGE_TOKEN_ID, INFO, FakeEngine

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "server" / "schemathesis.toml"
SEED = 42
FAKE_EXAMPLES = int(os.environ.get("DSPARK_CONTRACT_EXAMPLES", "50"))
REAL_EXAMPLES = int(os.environ.get("DSPARK_CONTRACT_REAL_EXAMPLES", "10"))
# Against the real engine, strings of valid bodies are cut to this many characters (and arrays to
# 3 items, contract_hooks.py): a fuzzed prompt of thousands of tokens costs tens of seconds of prefill.
REAL_MAX_CHARS = 200
POLICIES = {"tolerant": (), "strict": ("--strict-params",)}


def schemathesis(base_url: str, max_examples: int, phases: str, workdir: Path,
                 max_chars: int = 0, paths: Iterable[str] = ()) -> subprocess.CompletedProcess[str]:
    """One Schemathesis run over the served schema: every check, valid and invalid data, a fixed seed.

    It runs in `workdir`, where it keeps its caches; the hooks are imported from the repository.
    `max_chars` > 0 cuts the strings of valid bodies to that length and their arrays to 3 items
    (contract_hooks.py). `paths`, when given, are the only operations tested.
    """
    cli = Path(sys.executable).with_name("schemathesis")
    command = [str(cli), "--config-file", str(CONFIG), "run", f"{base_url}/openapi.json", "--checks", "all",
               "--mode", "all", "--phases", phases, "--seed", str(SEED), "--max-examples", str(max_examples),
               "--workers", "1", "--request-timeout", "120", "--max-response-time", "120",
               "--generation-database", "none", "--no-color"]
    if paths:
        command += ["--include-path-regex", "^(" + "|".join(re.escape(p) for p in paths) + ")$"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "DSPARK_CONTRACT_MAX_CHARS": str(max_chars)}
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=1800)


def assert_clean(run: subprocess.CompletedProcess[str]) -> None:
    """The run found no failure and no error; on failure, show what Schemathesis reported."""
    assert run.returncode == 0, f"{run.stdout[-12000:]}\n{run.stderr[-3000:]}"
    assert re.search(r"\d+ generated, \d+ passed", run.stdout), run.stdout[-3000:]


def contract_engine() -> FakeEngine:
    """The fake for contract runs: any text encodes (NUL too), ids are checked against a vocabulary."""
    info = dataclasses.replace(INFO, context_length=1 << 20, vocab_size=1000)
    return FakeEngine(info=info, refuse_nul=False)


@pytest.mark.parametrize("policy", POLICIES)
def test_contract_over_the_fake_engine(policy, tmp_path):
    """All phases, both policies, against the app over the fake engine on loopback."""
    strict = policy == "strict"
    with live_server(contract_engine(), strict_params=strict, max_body_bytes=1 << 20) as live:
        examples = FAKE_EXAMPLES // 2 if strict else FAKE_EXAMPLES
        assert_clean(schemathesis(live.base_url, examples, "examples,coverage,fuzzing,stateful", tmp_path))


def _schema(base_url: str) -> dict[str, Any]:
    return httpx.get(f"{base_url}/openapi.json").json()


def _references(node: Any) -> set[str]:
    """Names of the components that `node` references directly."""
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_references(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_references(v) for v in node))
    return set()


def paths_that_differ(text: dict[str, Any], vision: dict[str, Any]) -> list[str]:
    """The paths whose operations differ between two schemas, in themselves or in a component they
    reference at any depth."""
    components, other = vision["components"]["schemas"], text["components"]["schemas"]
    changed = {name for name, body in components.items() if other.get(name) != body}
    refs = {name: _references(body) for name, body in components.items()}

    def reaches_a_change(names: set[str], seen: set[str]) -> bool:
        return any(n in changed or (n not in seen and reaches_a_change(refs.get(n, set()), seen | {n}))
                   for n in names)

    return [path for path, ops in vision["paths"].items()
            if ops != text["paths"].get(path) or reaches_a_change(_references(ops), set())]


@pytest.mark.parametrize("policy", POLICIES)
def test_contract_over_a_vision_fake_engine(policy, tmp_path):
    """The schema of a model that takes images documents image parts; the hooks make their URLs a small PNG.
    Only the operations whose schema images change are run: the others are the text-only runs' own."""
    strict = policy == "strict"
    info = dataclasses.replace(contract_engine()._info, vision=True, image_token_id=IMAGE_TOKEN_ID)
    engine = FakeEngine(info=info, refuse_nul=False)
    with live_server(contract_engine(), strict_params=strict, max_body_bytes=1 << 20) as text_only:
        text_schema = _schema(text_only.base_url)
    with live_server(engine, strict_params=strict, max_body_bytes=1 << 20) as live:
        changed = paths_that_differ(text_schema, _schema(live.base_url))
        assert "/v1/chat/completions" in changed and "/v1/models" not in changed, changed
        assert_clean(schemathesis(live.base_url, FAKE_EXAMPLES // 4, "examples,coverage,fuzzing", tmp_path,
                                  paths=changed))


@pytest.fixture(scope="module", params=list(POLICIES))
def real_server(request, default_model_dir) -> Iterator[tuple[str, ServeProcess]]:
    """`dspark serve` over the default model, in each policy (the tolerant one is the run's shared
    default server)."""
    if not POLICIES[request.param]:
        yield request.param, request.getfixturevalue("default_server")
        return
    server = ServeProcess(free_port(), *POLICIES[request.param])
    try:
        server.wait_ready()
        yield request.param, server
    finally:
        server.stop()


@pytest.mark.slow
def test_contract_against_the_real_server(real_server, tmp_path):
    """Fuzzing and stateful phases against the real engine (half the budget under --strict-params)."""
    policy, server = real_server
    examples = REAL_EXAMPLES // 2 if policy == "strict" else REAL_EXAMPLES
    assert_clean(schemathesis(server.base_url, max(examples, 1), "fuzzing,stateful", tmp_path, REAL_MAX_CHARS))
    assert "Traceback" not in "".join(server.output)


@pytest.mark.slow
def test_real_server_refuses_bad_text_plainly(real_server):
    """A lone surrogate and a prompt that is empty get a 400 naming the field, with nothing internal in it."""
    _, server = real_server
    raw = b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}'
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        surrogate = c.post(CHAT, content=raw, headers={"Content-Type": "application/json"})
        empty = c.post(COMPLETIONS, json={"prompt": "", "max_tokens": 2})
    assert surrogate.status_code == 400 and surrogate.json()["error"]["param"] == "messages[0].content"
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "prompt"
    for r in (surrogate, empty):
        message = r.json()["error"]["message"]
        assert not re.search(r"Error|Exception|Traceback|TextEncodeInput|File \"|/\w+/\w+\.py", message), message
