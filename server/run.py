"""Run the app under uvicorn (one worker: one engine per process) with a drain on SIGTERM."""

from __future__ import annotations

from types import FrameType

import uvicorn
from fastapi import FastAPI

from server.app import ReadyHook, create_app
from server.drain import Drain
from server.settings import ServerSettings

# Uvicorn's own deadline is a backstop: our drain interrupts requests at the grace period first.
_BACKSTOP_S = 2.0


class DrainingServer(uvicorn.Server):
    """A uvicorn server that starts the app's drain when it is asked to exit (SIGTERM, SIGINT)."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self._drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Stop admitting (503) and give in-flight requests the grace period, then exit."""
        self._drain.begin()
        super().handle_exit(sig, frame)


def make_server(settings: ServerSettings, app: FastAPI | None = None, *, on_ready: ReadyHook | None = None,
                log_level: str = "info") -> DrainingServer:
    """A configured server for `app` (default: `create_app(settings)` with the real engine)."""
    app = app or create_app(settings, on_ready=on_ready)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, workers=1, log_level=log_level, lifespan="on",
        timeout_graceful_shutdown=int(settings.drain_grace_s + _BACKSTOP_S),
    )
    return DrainingServer(config, app.state.app_state.drain)


def serve(settings: ServerSettings, *, on_ready: ReadyHook | None = None) -> None:
    """Serve until SIGTERM/SIGINT (blocking)."""
    make_server(settings, on_ready=on_ready).run()
