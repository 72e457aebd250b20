"""GET /metrics: valid Prometheus text whose counters move as requests complete."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import CHAT, chat_body

pytestmark = pytest.mark.anyio

_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                     r'(-?[0-9.]+(e[+-]?[0-9]+)?|NaN|[+-]Inf)$')


async def _scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for line in r.text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or _SAMPLE.match(line), line
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _get(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_exposition_parses_and_lists_families(client):
    """The exposition parses with the Prometheus parser, line by line, and has every family."""
    samples = await _scrape(client)
    names = {name for name, _ in samples}
    for family in ("dspark_queue_depth", "dspark_requests_running", "dspark_engine_state", "dspark_engine_info",
                   "dspark_time_to_first_token_seconds_count", "dspark_inter_token_latency_seconds_count",
                   "dspark_prompt_tokens_total", "dspark_generation_tokens_total", "dspark_spec_rounds_total",
                   "dspark_spec_draft_tokens_total", "dspark_spec_accepted_tokens_total"):
        assert family in names, family
    assert _get(samples, "dspark_engine_state", state="ready") == 1.0


async def test_counters_move_after_requests(client):
    """A completed request moves the outcome, token, latency and speculative counters."""
    before = await _scrape(client)
    assert (await client.post(CHAT, json=chat_body(stream=True))).status_code == 200
    assert (await client.post(CHAT, json=chat_body())).status_code == 200
    after = await _scrape(client)
    delta = lambda name, **labels: _get(after, name, **labels) - _get(before, name, **labels)  # noqa: E731
    assert delta("dspark_requests_total", endpoint="chat", outcome="ok") == 2
    assert delta("dspark_time_to_first_token_seconds_count") == 2
    assert delta("dspark_inter_token_latency_seconds_count") > 0
    assert delta("dspark_prompt_tokens_total") > 0 and delta("dspark_generation_tokens_total") > 0
    assert delta("dspark_spec_rounds_total") == 6 and delta("dspark_spec_draft_tokens_total") == 24
    assert delta("dspark_spec_verified_tokens_by_position_total", position="0") == 6
    assert delta("dspark_request_duration_seconds_count") == 2
    assert _get(after, "dspark_requests_running") == 0


async def test_refusals_are_counted_by_outcome(client):
    """Refused requests are counted too: invalid (400/404) by outcome label."""
    await client.post(CHAT, json=chat_body(n=2))
    await client.post(CHAT, json={**chat_body(), "model": "nope"})
    samples = await _scrape(client)
    assert _get(samples, "dspark_requests_total", endpoint="chat", outcome="invalid") == 2


async def test_cancelled_requests_are_counted():
    """A request whose client went away counts as cancelled, and running drops back to 0."""
    import httpx

    from server.app import create_app
    from tests.server.conftest import AsgiCall, settings, wait_until
    from tests.server.fake_engine import FakeEngine, Script

    engine = FakeEngine(lambda r: Script(rounds=["t"] * 100, round_delay_s=0.02))
    app = create_app(settings(), engine)
    call = AsgiCall(app, CHAT, chat_body(stream=True)).start()
    await wait_until(lambda: '"content":"t"' in call.body)
    call.disconnect.set()
    await call.finish()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        samples = await _scrape(c)
    assert _get(samples, "dspark_requests_total", endpoint="chat", outcome="cancelled") == 1
    assert _get(samples, "dspark_requests_running") == 0


async def test_an_admitted_request_that_fails_is_counted_once():
    """A non-streaming request whose engine fails after admission is one `error`, and a refusal one `invalid`."""
    import httpx

    from engine.api import EngineError
    from server.app import create_app
    from tests.server.conftest import settings
    from tests.server.fake_engine import FakeEngine, Script

    engine = FakeEngine(lambda r: Script(rounds=["a", "b"], fail_after=1, fail_with=EngineError("boom")))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(settings(), engine)),
                                 base_url="http://127.0.0.1") as c:
        failed = await c.post(CHAT, json=chat_body())
        refused = await c.post(CHAT, json=chat_body(n=2))
        samples = await _scrape(c)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
    assert refused.status_code == 400
    counts = {o: _get(samples, "dspark_requests_total", endpoint="chat", outcome=o)
              for o in ("ok", "error", "invalid", "cancelled")}
    assert counts == {"ok": 0, "error": 1, "invalid": 1, "cancelled": 0}
    assert _get(samples, "dspark_requests_running") == 0
