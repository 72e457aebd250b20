"""/health, /v1/models and /metrics name the drafter kind, and count rounds and drafts by kind."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.api import KindStats, SpecStats
from server.app import create_app
from server.metrics import Metrics
from tests.server.conftest import settings
from tests.server.fake_engine import INFO, FakeEngine

pytestmark = pytest.mark.anyio

LOOKUP_INFO = replace(INFO, mode="lookup", drafter=None, drafter_kind="lookup", requested_mode="auto",
                      mode_note="auto: no trained drafter is known for fake-model: drafting by prompt lookup")


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_health_models_and_engine_info_name_the_drafter_kind():
    """The served kind is in /health, /v1/models and the dspark_engine_info labels."""
    app = create_app(settings(), FakeEngine(info=LOOKUP_INFO))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        health = (await c.get("/health")).json()
        card = (await c.get("/v1/models")).json()["data"][0]
        metrics = (await c.get("/metrics")).text
    assert (health["mode"], health["drafter_kind"], health["requested_mode"]) == ("lookup", "lookup", "auto")
    assert card["dspark"]["drafter_kind"] == "lookup"
    info = [labels for (name, labels) in _samples(metrics) if name == "dspark_engine_info"]
    assert len(info) == 1 and dict(info[0])["drafter_kind"] == "lookup" and dict(info[0])["mode"] == "lookup"


def test_counters_by_kind_add_up_and_keep_the_old_names():
    """Per-kind rounds, drafts, accepts and no-match rounds are counted beside the unchanged totals."""
    metrics = Metrics(lambda: None)
    stats = SpecStats(mode="lookup", cap=8, rounds=7, drafted_tokens=12, accepted_tokens=9,
                      accepted_by_position=[3, 3], verified_by_position=[4, 3],
                      by_kind={"lookup": KindStats(rounds=4, drafted_tokens=12, accepted_tokens=9, empty_rounds=3)})
    metrics.record_stats(stats)
    metrics.record_stats(stats)
    got = _samples(metrics.render().decode())
    kind = (("kind", "lookup"),)
    assert got[("dspark_spec_rounds_by_kind_total", kind)] == 8
    assert got[("dspark_spec_draft_tokens_by_kind_total", kind)] == 24
    assert got[("dspark_spec_accepted_tokens_by_kind_total", kind)] == 18
    assert got[("dspark_spec_empty_rounds_by_kind_total", kind)] == 6
    assert got[("dspark_spec_draft_tokens_total", ())] == 24 and got[("dspark_spec_rounds_total", ())] == 14


async def test_health_reports_the_draft_vocabulary():
    """A drafter with a shortlist: /health gives its size as draft_vocab (absent: null)."""
    for info, expected in ((replace(INFO, draft_vocab=8192), 8192), (INFO, None)):
        app = create_app(settings(), FakeEngine(info=info))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            assert (await c.get("/health")).json()["draft_vocab"] == expected
