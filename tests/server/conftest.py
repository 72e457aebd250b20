"""Fixtures for the HTTP layer: the app over a FakeEngine, in-process and under real uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from server.app import create_app
from server.run import DrainingServer, make_server
from server.settings import ServerSettings
from tests.server.fake_engine import FakeEngine

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


# How long a condition may take before the test fails: a hang guard, never a speed bound, so it
# is generous enough for a loaded machine.
WAIT_GUARD_S = 30.0


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (marked `anyio`) run on asyncio, like uvicorn."""
    return "asyncio"


def settings(**overrides: Any) -> ServerSettings:
    """Test settings: fast keep-alives, a small body cap, nothing read from the environment."""
    values: dict[str, Any] = {"keepalive_s": 0.05, "max_body_bytes": 64 * 1024, "drain_grace_s": 1.0, **overrides}
    return ServerSettings.model_construct(**values)  # no validation: the environment is not read


def chat_body(content: str = "hi", **extra: Any) -> dict[str, Any]:
    """A minimal valid chat request."""
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}


def sse_frames(text: str) -> list[str]:
    """The raw frames of an event stream (without the blank-line separators)."""
    return [frame for frame in text.split("\n\n") if frame]


def sse_data(text: str) -> list[Any]:
    """The `data:` payloads: parsed JSON, or the literal "[DONE]"."""
    out: list[Any] = []
    for frame in sse_frames(text):
        if frame.startswith("data: "):
            payload = frame[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


@pytest.fixture
def engine() -> FakeEngine:
    """A ready fake engine with the default echo script."""
    return FakeEngine()


@pytest.fixture
def app(engine: FakeEngine):
    """The app over `engine`."""
    return create_app(settings(), engine)


@pytest.fixture
async def client(app):
    """An httpx client calling the app in-process."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        yield c


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """A real uvicorn server in a background thread (its own event loop)."""

    def __init__(self, server: DrainingServer, port: int) -> None:
        self.server = server
        self.base_url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=server.run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + WAIT_GUARD_S
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextlib.contextmanager
def live_server(engine: FakeEngine, **overrides: Any) -> Iterator[LiveServer]:
    """Run the app over `engine` under uvicorn on a free loopback port."""
    port = free_port()
    s = settings(port=port, **overrides)
    live = LiveServer(make_server(s, create_app(s, engine), log_level="warning"), port)
    live.start()
    try:
        yield live
    finally:
        live.stop()


async def wait_until(predicate: Any, timeout: float = WAIT_GUARD_S) -> None:
    """Poll `predicate()` on the event loop until it is true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def wait_until_sync(predicate: Any, timeout: float = WAIT_GUARD_S) -> None:
    """Poll `predicate()` from a plain thread until it is true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


class AsgiCall:
    """Drive the ASGI app directly, so a test decides when the client disconnects."""

    def __init__(self, app: Any, path: str, body: dict[str, Any]) -> None:
        self.app, self.path = app, path
        self.raw = json.dumps(body).encode()
        self.sent: list[dict[str, Any]] = []
        self.disconnect = asyncio.Event()
        self._body_sent = False
        self._sent_more = asyncio.Condition()
        self.task: asyncio.Task | None = None

    @property
    def body(self) -> str:
        """Everything the app has sent so far."""
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body").decode()

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)

    async def _receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.raw, "more_body": False}
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        async with self._sent_more:
            self._sent_more.notify_all()

    async def wait_sent(self, predicate: Any, timeout: float = 10.0) -> None:
        """Wait until `predicate(self)` holds, checked again at every message the app sends."""
        async with self._sent_more:
            await asyncio.wait_for(self._sent_more.wait_for(lambda: predicate(self)), timeout)

    def start(self) -> AsgiCall:
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": self.path, "raw_path": self.path.encode(),
                 "query_string": b"", "root_path": "", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(self.raw)).encode())]}
        self.task = asyncio.ensure_future(self.app(scope, self._receive, self._send))
        return self

    async def finish(self, timeout: float = 2.0) -> None:
        """Wait for the app to return."""
        assert self.task is not None
        await asyncio.wait_for(self.task, timeout)
