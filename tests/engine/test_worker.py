"""The worker thread and the asyncio client: events, errors as values, cancel, admission, seeds."""

import asyncio
import threading

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from engine.api import (
    ContextLengthExceeded, EngineConfig, EngineDead, EngineError, EngineInfo, EngineOverloaded, Finished,
    GenerationRequest, SamplingParams, SpecConfig, TokenEvent,
)
from engine import backend
from engine.client import EngineClient
from engine.runtime import Runtime
from engine.scheduler import CostCurve, Scheduler
from engine.generate import generate
from tests.engine import tiny
from tests.cpu_pinning import machine_cores


class CountingTarget:
    """Target proxy that counts forwards and can be told to fail or to pause."""

    def __init__(self, target):
        self.inner, self.forwards, self.fail, self.gate = target, 0, False, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, ids, cache, taps=True, inputs=None):
        self.forwards += 1
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail:
            raise RuntimeError("boom")
        return self.inner.forward(ids, cache, taps=taps, inputs=inputs)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return load_tokenizer(default_model_dir)


def make_client(tokenizer, target, max_queue=4, mode="dspark"):
    drafter = tiny.dspark_drafter() if mode == "dspark" else None
    info = EngineInfo(model_id="tiny", model_path="-", mode=mode, drafter="random" if drafter else None,
                      cap=2 if drafter else None, context_length=64, sampler="rejection")
    runtime = Runtime(target, drafter, tokenizer, info, frozenset(), SpecConfig(mode=mode, max_draft=2))
    runtime.make_scheduler = lambda: Scheduler(2) if drafter else None
    client = EngineClient(EngineConfig(max_queue=max_queue), runtime_factory=lambda cfg: runtime)
    client.start()
    while client.state == "loading":
        threading.Event().wait(0.01)
    return client


def request(max_tokens=8, seed=None, temperature=0.0, prompt=(5, 6, 7)):
    return GenerationRequest("r", prompt, max_tokens, SamplingParams(temperature=temperature, seed=seed))


async def started(handle):
    """Wait until the worker has picked the request up."""
    while not handle.job.started.is_set():
        await asyncio.sleep(0.01)
    return handle


async def collect(client, handle):
    events = [ev async for ev in client.stream(handle)]
    return events


def test_events_then_one_finished(tokenizer):
    """A request yields TokenEvents then exactly one Finished with usage and statistics."""
    client = make_client(tokenizer, tiny.tiny_target())

    async def main():
        return await collect(client, client.submit(request(max_tokens=9)))

    events = asyncio.run(main())
    assert all(isinstance(e, TokenEvent) for e in events[:-1]) and isinstance(events[-1], Finished)
    ids = [t for e in events[:-1] for t in e.token_ids]
    assert len(ids) == 9 and events[-1].usage.completion_tokens == 9 and events[-1].reason == "length"
    assert "".join(e.text for e in events[:-1]) + events[-1].text == tokenizer.decode(ids)
    assert events[-1].stats.rounds >= 1
    asyncio.run(client.shutdown())


def test_model_error_is_failed_and_next_request_succeeds(tokenizer):
    """An exception in the model becomes the stream's EngineError; the worker keeps serving."""
    target = CountingTarget(tiny.tiny_target())
    client = make_client(tokenizer, target)

    async def main():
        target.fail = True
        with pytest.raises(EngineError, match="internal error"):
            await collect(client, client.submit(request()))
        target.fail = False
        return await collect(client, client.submit(request()))

    assert isinstance(asyncio.run(main())[-1], Finished)
    assert client.state == "ready"
    asyncio.run(client.shutdown())


def test_cancel_frees_worker_within_one_round(tokenizer):
    """Stopping the stream cancels: at most one more round runs, then the next request is served."""
    target = CountingTarget(tiny.tiny_target())
    client = make_client(tokenizer, target, mode="baseline")

    async def main():
        handle = client.submit(request(max_tokens=60))
        stream = client.stream(handle)
        await stream.__anext__()
        await stream.aclose()  # what a disconnect does
        at_cancel = target.forwards
        events = await collect(client, client.submit(request(max_tokens=3)))
        return at_cancel, events

    at_cancel, events = asyncio.run(main())
    # the cancelled request may finish its current round (1 forward) before it is dropped;
    # the second request needs 1 prefill + 2 rounds = 3 forwards
    assert target.forwards - at_cancel <= 1 + 3
    assert isinstance(events[-1], Finished)
    asyncio.run(client.shutdown())


def test_cancel_while_queued_never_runs(tokenizer):
    """A request cancelled while waiting in the queue is dropped without any model work."""
    target = CountingTarget(tiny.tiny_target())
    client = make_client(tokenizer, target, mode="baseline")

    async def main():
        target.gate = threading.Event()
        first = await started(client.submit(request(max_tokens=2)))
        queued = client.submit(request(max_tokens=2))
        assert queued.queue_position == 1 and client.queue_depth() == 1
        client.cancel(queued)
        target.gate.set()
        target.gate = None
        await collect(client, first)
        await collect(client, client.submit(request(max_tokens=1)))  # runs after the cancelled one
        return target.forwards

    assert asyncio.run(main()) == 2 + 1  # first: prefill + 1 round; last: prefill only
    asyncio.run(client.shutdown())


def test_admission_bound_and_context_length(tokenizer):
    """Past max_queue waiting requests submit raises EngineOverloaded; too long raises at submit."""
    target = CountingTarget(tiny.tiny_target())
    client = make_client(tokenizer, target, max_queue=1, mode="baseline")

    async def main():
        target.gate = threading.Event()
        running = await started(client.submit(request(max_tokens=1)))
        waiting = client.submit(request(max_tokens=1))
        with pytest.raises(EngineOverloaded):
            client.submit(request(max_tokens=1))
        with pytest.raises(ContextLengthExceeded, match="maximum context length is 64"):
            client.submit(request(max_tokens=62))
        target.gate.set()
        target.gate = None
        await collect(client, running)
        await collect(client, waiting)

    asyncio.run(main())
    asyncio.run(client.shutdown())


def test_seeded_sampling_reproducible_in_worker_thread(tokenizer):
    """Same seed, same tokens at temperature 1 (explicit keys, not the global PRNG)."""
    client = make_client(tokenizer, tiny.tiny_target())

    async def run(seed):
        events = await collect(client, client.submit(request(max_tokens=12, seed=seed, temperature=1.0)))
        return [t for e in events[:-1] for t in e.token_ids]

    a, b, c = asyncio.run(run(7)), asyncio.run(run(7)), asyncio.run(run(8))
    assert a == b and a != c
    asyncio.run(client.shutdown())


def test_load_failure_marks_engine_dead():
    """A model that fails to load makes the engine dead with a reason; submit raises EngineDead."""
    def broken(cfg):
        raise FileNotFoundError("no such model")

    client = EngineClient(EngineConfig(), runtime_factory=broken)
    client.start()
    client._worker.join(5)
    assert client.state == "dead" and "no such model" in client.dead_reason

    async def main():
        with pytest.raises(EngineDead):
            client.submit(request())

    asyncio.run(main())


class _ThreadSpy:
    """Target proxy that records the BLAS thread count at every forward."""

    def __init__(self, target):
        self.inner, self.seen = target, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, ids, cache, taps=True, inputs=None):
        self.seen.append((ids.shape[1], backend.current_blas_threads()))
        return self.inner.forward(ids, cache, taps=taps, inputs=inputs)


@pytest.mark.skipif(not backend.can_set_threads() or machine_cores() < 2,
                    reason="needs a BLAS whose thread count we set, on >= 2 cores")
def test_decode_rounds_run_at_the_curves_thread_count(tokenizer):
    """Prefill runs at the loaded count, every decode round at the curve's decode_threads, then the
    count is restored; the greedy tokens equal those of a runtime that never changes it."""
    with backend.blas_threads(2):  # as if loaded at 2 (the suite's workers load 1: tests/conftest.py)
        _check_decode_threads(tokenizer)


def _check_decode_threads(tokenizer):
    loaded = backend.current_blas_threads()
    spy = _ThreadSpy(tiny.tiny_target())
    drafter = tiny.dspark_drafter()
    info = EngineInfo(model_id="tiny", model_path="-", mode="dspark", drafter="random", cap=2, context_length=64,
                      sampler="rejection")
    curve = CostCurve(verify_s=[1.0, 1.1, 1.2, 1.3, 1.4], draft_fixed_s=0.1, draft_per_token_s=0.01, decode_threads=1)
    results = []
    for c in (curve, None):
        runtime = Runtime(spy, drafter, tokenizer, info, frozenset(), SpecConfig(mode="dspark", max_draft=2), c)
        spy.seen.clear()
        ids, _, _ = generate(runtime, request(max_tokens=12))
        results.append(ids)
        if c is not None:
            seen = list(spy.seen)
    assert seen[0] == (3, loaded) and len(seen) > 2  # the prompt (3 ids) at the loaded count
    assert all(threads == 1 for _, threads in seen[1:])
    assert backend.current_blas_threads() == loaded
    assert all(threads == loaded for _, threads in spy.seen)  # no curve: the BLAS is left alone
    assert results[0] == results[1] and len(results[0]) == 12
