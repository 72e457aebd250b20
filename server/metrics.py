"""Prometheus metrics for /metrics, one registry per app (so tests can run many apps).

Requests by endpoint and outcome, running requests and queue depth, TTFT / inter-token latency /
request duration histograms, prompt and generated tokens, and the speculative counters: rounds,
drafted and accepted tokens, and accepted / verified tokens by draft position (their ratio is
the per-position acceptance rate), the same by the kind that drafted each round (dspark, dflash,
lookup; a hybrid's rounds count under the kind it chose) with the rounds whose drafter proposed
nothing, and lookup rounds drafted from other requests' outputs (`--lookup-history`). Engine state,
what is served and the lookup history's size are read at scrape time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.api import Finished, SpecStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Outcomes of a generation request (label values of dspark_requests_total).
OK, CANCELLED, INVALID, OVERLOADED, UNAVAILABLE, ERROR, INTERRUPTED = (
    "ok", "cancelled", "invalid", "overloaded", "unavailable", "error", "interrupted"
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

EngineGetter = Callable[[], Any]

MAX_IGNORED_LABELS = 200  # distinct ignored-field names with a series of their own
OTHER_FIELDS = "(other)"


def outcome_for_status(status: int) -> str:
    """The outcome label of a request refused with `status`."""
    if status == 429:
        return OVERLOADED
    if status == 499:
        return CANCELLED
    if status == 503:
        return UNAVAILABLE
    return ERROR if status >= 500 else INVALID


class Metrics:
    """The app's metric families and the helpers that update them."""

    def __init__(self, engine: EngineGetter) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("dspark_requests", "Generation requests by endpoint and outcome",
                                ["endpoint", "outcome"], registry=r)
        self.running = Gauge("dspark_requests_running", "Admitted requests not yet finished", registry=r)
        self.ttft = Histogram("dspark_time_to_first_token_seconds", "Submit to first committed tokens",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("dspark_inter_token_latency_seconds", "Time between output tokens (round gap / tokens)",
                             buckets=_ITL_BUCKETS, registry=r)
        self.duration = Histogram("dspark_request_duration_seconds", "Submit to the end of the request",
                                  buckets=_DURATION_BUCKETS, registry=r)
        self.prompt_tokens = Counter("dspark_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generation_tokens = Counter("dspark_generation_tokens", "Tokens generated", registry=r)
        self.rounds = Counter("dspark_spec_rounds", "Speculative rounds (draft, verify, accept)", registry=r)
        self.drafted = Counter("dspark_spec_draft_tokens", "Draft tokens sent to verification", registry=r)
        self.accepted = Counter("dspark_spec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.accepted_at = Counter("dspark_spec_accepted_tokens_by_position", "Accepted drafts at each draft slot",
                                   ["position"], registry=r)
        self.verified_at = Counter("dspark_spec_verified_tokens_by_position", "Verified drafts at each draft slot",
                                   ["position"], registry=r)
        self.kind_rounds = Counter("dspark_spec_rounds_by_kind", "Rounds that verified drafts, by drafter kind",
                                   ["kind"], registry=r)
        self.kind_drafted = Counter("dspark_spec_draft_tokens_by_kind", "Draft tokens sent to verification, by drafter "
                                    "kind", ["kind"], registry=r)
        self.kind_accepted = Counter("dspark_spec_accepted_tokens_by_kind", "Draft tokens accepted, by drafter kind",
                                     ["kind"], registry=r)
        self.kind_empty = Counter("dspark_spec_empty_rounds_by_kind", "Rounds decoded plainly because the drafter "
                                  "proposed nothing (lookup: no match), by drafter kind", ["kind"], registry=r)
        self.history_rounds = Counter("dspark_lookup_history_rounds", "Lookup rounds drafted from earlier requests' "
                                      "outputs (--lookup-history)", registry=r)
        self.history_accepted = Counter("dspark_lookup_history_accepted_tokens", "Accepted drafts of lookup rounds "
                                        "drafted from earlier requests' outputs", registry=r)
        self.ignored = Counter("dspark_ignored_fields", "Request fields ignored by the tolerant policy, by name",
                               ["field"], registry=r)
        self._ignored_labels: set[str] = set()
        r.register(_EngineCollector(engine))
        self._mean_duration_s = 0.0

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)

    def count(self, endpoint: str, outcome: str) -> None:
        """Count one request outcome."""
        self.requests.labels(endpoint=endpoint, outcome=outcome).inc()

    def ignored_fields(self, names: list[str]) -> None:
        """Count the request fields one request carried that the server ignored.

        Clients choose the names, so at most MAX_IGNORED_LABELS distinct ones get a series of their own
        and the rest are counted as `(other)`: the registry cannot be grown without bound.
        """
        for name in names:
            if name not in self._ignored_labels and len(self._ignored_labels) >= MAX_IGNORED_LABELS:
                name = OTHER_FIELDS
            self._ignored_labels.add(name)
            self.ignored.labels(field=name).inc()

    def record_stats(self, stats: SpecStats) -> None:
        """Add one finished request's speculative statistics."""
        self.rounds.inc(stats.rounds)
        self.drafted.inc(stats.drafted_tokens)
        self.accepted.inc(stats.accepted_tokens)
        by_position = zip(stats.accepted_by_position, stats.verified_by_position, strict=False)
        for i, (accepted, verified) in enumerate(by_position):
            self.accepted_at.labels(position=str(i)).inc(accepted)
            self.verified_at.labels(position=str(i)).inc(verified)
        for kind, counts in stats.by_kind.items():
            self.kind_rounds.labels(kind=kind).inc(counts.rounds)
            self.kind_drafted.labels(kind=kind).inc(counts.drafted_tokens)
            self.kind_accepted.labels(kind=kind).inc(counts.accepted_tokens)
            self.kind_empty.labels(kind=kind).inc(counts.empty_rounds)
            self.history_rounds.inc(counts.history_rounds)
            self.history_accepted.inc(counts.history_accepted_tokens)

    def observe_duration(self, seconds: float) -> None:
        """One finished request's wall time; also feeds the Retry-After estimate."""
        self.duration.observe(seconds)
        weight = 0.2 if self._mean_duration_s else 1.0
        self._mean_duration_s += weight * (seconds - self._mean_duration_s)

    def retry_after_s(self, queue_depth: int) -> int:
        """Seconds until a queue slot is likely free: mean request time times the queue ahead."""
        estimate = self._mean_duration_s * max(queue_depth, 1)
        return int(min(max(math.ceil(estimate), 1), 60))

    def start(self, endpoint: str) -> RequestRecorder:
        """Begin timing one admitted request."""
        return RequestRecorder(self, endpoint)


class RequestRecorder:
    """Per-request timings: TTFT, inter-token latency, tokens and the final outcome."""

    def __init__(self, metrics: Metrics, endpoint: str) -> None:
        self._m = metrics
        self._endpoint = endpoint
        self._t0 = time.perf_counter()
        self._last: float | None = None
        self._closed = False
        metrics.running.inc()

    def tokens(self, num_tokens: int, num_prompt_tokens: int) -> None:
        """One engine round committed `num_tokens` tokens."""
        now = time.perf_counter()
        if self._last is None:
            self._m.ttft.observe(now - self._t0)
            self._m.prompt_tokens.inc(num_prompt_tokens)
        elif num_tokens:
            gap = (now - self._last) / num_tokens
            for _ in range(num_tokens):
                self._m.itl.observe(gap)
        self._last = now
        self._m.generation_tokens.inc(num_tokens)

    def finished(self, event: Finished) -> None:
        """The request completed; record its speculative statistics."""
        self._m.record_stats(event.stats)

    def close(self, outcome: str) -> None:
        """Count the outcome once and stop the running gauge."""
        if self._closed:
            return
        self._closed = True
        self._m.running.dec()
        self._m.count(self._endpoint, outcome)
        if outcome == OK:
            self._m.observe_duration(time.perf_counter() - self._t0)


class _EngineCollector(Collector):
    """Engine state, queue depth and what is served, read from the engine at scrape time."""

    def __init__(self, engine: EngineGetter) -> None:
        self._engine = engine

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        engine = self._engine()
        state = engine.state if engine is not None else "loading"
        states = GaugeMetricFamily("dspark_engine_state", "1 for the engine's current state", labels=["state"])
        for name in ("loading", "ready", "dead"):
            states.add_metric([name], 1.0 if state == name else 0.0)
        yield states
        depth = engine.queue_depth() if engine is not None and state == "ready" else 0
        yield GaugeMetricFamily("dspark_queue_depth", "Requests waiting behind the running one", value=depth)
        info = engine.info() if engine is not None and state == "ready" else None
        if info is not None:
            served = GaugeMetricFamily("dspark_engine_info", "What is served (value 1)",
                                       labels=["model", "mode", "drafter", "drafter_kind", "sampler", "cap"])
            served.add_metric([info.model_id, info.mode, info.drafter or "", info.drafter_kind or "", info.sampler,
                               str(info.cap or "")], 1.0)
            yield served
            yield from _history_gauges(info.lookup_history)
            yield from _prefix_cache_metrics(info.prefix_cache)


def _history_gauges(usage) -> Iterator[GaugeMetricFamily]:
    """The cross-request lookup history's budget, tokens held and approximate bytes (none when off)."""
    if usage is None:
        return
    yield GaugeMetricFamily("dspark_lookup_history_budget_tokens", "Most tokens the lookup history keeps",
                            value=usage.budget_tokens)
    yield GaugeMetricFamily("dspark_lookup_history_tokens", "Tokens of earlier outputs the lookup history holds",
                            value=usage.tokens)
    yield GaugeMetricFamily("dspark_lookup_history_bytes", "Approximate memory of the lookup history",
                            value=usage.approx_bytes)


def _prefix_cache_metrics(usage) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The prefix cache's budget, bytes and entries, and its hit and miss prompt tokens (none when off)."""
    if usage is None:
        return
    yield GaugeMetricFamily("dspark_prefix_cache_budget_bytes", "Most bytes the prefix cache holds",
                            value=usage.budget_bytes)
    yield GaugeMetricFamily("dspark_prefix_cache_bytes", "Bytes the prefix cache holds", value=usage.bytes)
    yield GaugeMetricFamily("dspark_prefix_cache_entries", "States the prefix cache holds", value=usage.entries)
    yield CounterMetricFamily("dspark_prefix_cache_hit_tokens", "Prompt tokens restored from the prefix cache",
                              value=usage.hit_tokens)
    yield CounterMetricFamily("dspark_prefix_cache_miss_tokens", "Prompt tokens prefilled (not in the prefix cache)",
                              value=usage.miss_tokens)
    yield CounterMetricFamily("dspark_prefix_cache_evictions", "States evicted from the prefix cache",
                              value=usage.evictions)
