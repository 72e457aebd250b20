"""Every example in clients/ runs against a real `dspark serve` (default model, API key on) and its
output is checked against the server's own greedy/seeded answer for the same request."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.real_server import ServeProcess, clean_env
from tests.server.conftest import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "clients"
API_KEY = "clients-test-key"
PROMPT = "What is the capital of France?"
MAX_TOKENS = 10
SEED = 7
DOCUMENTED_BASE_URL = "http://127.0.0.1:8000/v1"


@pytest.fixture(scope="module")
def served(default_model_dir) -> Iterator[ServeProcess]:
    """The real server over the default model, requiring an API key (so the examples must send it)."""
    server = ServeProcess(free_port(), "--api-key", API_KEY)
    try:
        server.health = server.wait_ready()
        yield server
    finally:
        server.stop()


def _ask(served: ServeProcess, **fields) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
            "temperature": 0, **fields}
    r = httpx.post(f"{served.base_url}/v1/chat/completions", json=body, timeout=120,
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def reference(served) -> dict:
    """The server's greedy reply to PROMPT, asked directly over HTTP (what every example must print)."""
    reply = _ask(served)
    assert reply["choices"][0]["message"]["content"].strip()
    return reply


@pytest.fixture(scope="module")
def expected(reference) -> str:
    """The reference reply's text."""
    return reference["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def num_tokens(reference) -> int:
    """The reference reply's completion tokens (MAX_TOKENS or fewer when the model stops)."""
    return reference["usage"]["completion_tokens"]


def run_example(served: ServeProcess, argv: list[str], *, key: str | None = API_KEY, cwd: Path = ROOT,
                stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run one example with the server's base URL (and key) in the OpenAI SDKs' usual variables."""
    env = clean_env() | {"OPENAI_BASE_URL": f"{served.base_url}/v1", "MAX_TOKENS": str(MAX_TOKENS)}
    env.pop("OPENAI_API_KEY", None)
    if key is not None:
        env["OPENAI_API_KEY"] = key
    done = subprocess.run(argv, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=180)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def _line(stdout: str, label: str) -> str:
    """The text after `label> ` (to the next labelled line, so multi-line replies survive)."""
    rest = stdout.split(f"\n{label}> ", 1)[1] if f"\n{label}> " in stdout else stdout.split(f"{label}> ", 1)[1]
    return rest.split("\n", 1)[0]


def test_openai_sdk_chat_stream_and_seed(served, expected, num_tokens):
    """openai_sdk.py prints the greedy reply, the same text streamed with usage, and a seed-stable sample."""
    out = run_example(served, [sys.executable, "clients/openai_sdk.py", "--prompt", PROMPT,
                               "--max-tokens", str(MAX_TOKENS), "--seed", str(SEED)]).stdout
    assert f"chat> {expected}\n" in out and f"stream> {expected}\n" in out
    assert _line(out, "usage").split()[1] == f"completion={num_tokens}"
    assert _line(out, "stream-usage") == f"completion={num_tokens}"
    assert _line(out, "stats").startswith(f"mode={served.health['mode']} ")
    sampled = _ask(served, temperature=0.8, seed=SEED)["choices"][0]["message"]["content"]
    assert out.count(f"seed {SEED}> {sampled}\n") == 2
    assert "same-seed-same-text> True" in out


def test_curl_chat(served, expected, num_tokens):
    """curl/chat.sh prints the server's JSON reply: the greedy text and the requested length."""
    reply = json.loads(run_example(served, ["bash", "clients/curl/chat.sh", PROMPT]).stdout)
    assert reply["choices"][0]["message"]["content"] == expected
    assert reply["usage"]["completion_tokens"] == num_tokens and "dspark_stats" in reply


def test_curl_stream(served, expected, num_tokens):
    """curl/stream.sh prints raw SSE: content deltas that join to the greedy text, usage, then [DONE]."""
    out = run_example(served, ["bash", "clients/curl/stream.sh", PROMPT]).stdout
    frames = [line[len("data: "):] for line in out.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == expected
    assert chunks[-1]["usage"]["completion_tokens"] == num_tokens


def test_curl_sends_the_api_key(served):
    """Without OPENAI_API_KEY the curl script fails with the server's 401 body (so the key is really sent)."""
    done = run_example(served, ["bash", "clients/curl/chat.sh", PROMPT], key=None, check=False)
    assert done.returncode != 0 and "invalid_api_key" in done.stdout


def test_node_example(served, expected, num_tokens):
    """node/chat.mjs (the openai npm package) prints the greedy reply, then the same text streamed."""
    node_dir = CLIENTS / "node"
    if shutil.which("node") is None or not (node_dir / "node_modules" / "openai").is_dir():
        pytest.fail("node or clients/node/node_modules missing: run scripts/bootstrap.sh (as `make test` does)")
    out = run_example(served, ["node", "chat.mjs", PROMPT], cwd=node_dir).stdout
    assert f"chat> {expected}\n" in out and f"stream> {expected}\n" in out
    assert _line(out, "usage") == _line(out, "stream-usage") == f"completion={num_tokens}"
    assert _line(out, "stats").startswith(f"mode={served.health['mode']} ")


def test_langchain_example(served, expected, num_tokens):
    """langchain_openai_example.py: ChatOpenAI.invoke and .stream both give the greedy reply."""
    out = run_example(served, [sys.executable, "clients/langchain_openai_example.py", "--prompt", PROMPT,
                               "--max-tokens", str(MAX_TOKENS)]).stdout
    assert f"invoke> {expected}\n" in out and f"stream> {expected}\n" in out
    assert f"'output_tokens': {num_tokens}" in _line(out, "usage")


def test_terminal_chat(served, expected, num_tokens):
    """chat.py streams each turn of a two-turn conversation and prints a status line after each."""
    out = run_example(served, [sys.executable, "clients/chat.py", "--temperature", "0", "--max-tokens",
                               str(MAX_TOKENS)], stdin=f"{PROMPT}\n\nAnd of Italy?\n/quit\n").stdout
    lines = out.splitlines()
    status = [line for line in lines if line.startswith("[")]
    assert lines[0] == expected and len(status) == 2, out
    assert status[0].startswith(f"[{num_tokens} tokens, ")
    mode = served.health["mode"]
    shown = f"{mode}: no drafts" if mode == "baseline" else "acceptance"
    for line in status:
        assert re.fullmatch(r"\[\d+ tokens, [\d.]+ tok/s, server [\d.]+ tok/s, .+\]", line) and shown in line, line


def _load_chat_module():
    spec = importlib.util.spec_from_file_location("clients_chat", CLIENTS / "chat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_status_line_shows_acceptance():
    """With drafts, the status line shows accepted/drafted and the mean accepted length per round."""
    stats = {"mode": "dspark", "cap": 6, "drafted_tokens": 40, "accepted_tokens": 30, "mean_accepted_length": 3.25,
             "tokens_per_s": 41.5}
    line = _load_chat_module().status_line(26, 0.5, stats)
    assert line == "[26 tokens, 52.0 tok/s, server 41.5 tok/s, dspark cap 6: acceptance 75%, 3.25 accepted/round]"


def test_continue_config_talks_to_the_server(served):
    """Continue's config points at the server's documented default URL, and its model id is served."""
    model = yaml.safe_load((CLIENTS / "editors" / "continue.yaml").read_text())["models"][0]
    assert model["provider"] == "openai" and model["apiBase"] == DOCUMENTED_BASE_URL
    reply = _ask(served, model=model["model"], max_tokens=2)
    assert reply["usage"]["completion_tokens"] == 2


def test_zed_config_talks_to_the_server(served):
    """Zed's config: default URL, a served model id, Zed's default capabilities but images (text-only model),
    max_tokens within context; a request shaped as Zed sends it with those capabilities is served."""
    provider = json.loads((CLIENTS / "editors" / "zed-settings.json").read_text())
    (entry,) = provider["language_models"]["openai_compatible"].values()
    assert entry["api_url"] == DOCUMENTED_BASE_URL
    (model,) = entry["available_models"]
    assert model["capabilities"] == {"tools": True, "images": False, "parallel_tool_calls": True,
                                     "prompt_cache_key": True}
    assert model["max_tokens"] <= served.health["context_length"]
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    reply = _ask(served, model=model["name"], max_tokens=2, tools=tools, tool_choice="auto",
                 parallel_tool_calls=True, prompt_cache_key="thread-1")
    assert reply["usage"]["completion_tokens"] == 2


def test_documented_base_url_is_the_server_default():
    """The URL written in the examples is the one `dspark serve` uses by default."""
    from server.settings import ServerSettings

    assert ServerSettings.model_construct().base_url() == DOCUMENTED_BASE_URL
    for path in [*CLIENTS.glob("*.py"), CLIENTS / "node" / "chat.mjs", CLIENTS / "curl" / "common.sh"]:
        assert DOCUMENTED_BASE_URL in path.read_text(), path

