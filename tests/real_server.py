"""`dspark serve` in a child process on the loopback interface, for tests that drive it over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx


def clean_env() -> dict[str, str]:
    """The test environment without DSPARK_* settings (the cache location excepted)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DSPARK_") or k == "DSPARK_CACHE"}


class ServeProcess:
    """`dspark serve` running in a child process; its output is collected by a thread."""

    def __init__(self, port: int, *extra_args: str) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dspark_cli.main", "serve", "--port", str(port), "--drain-grace", "20",
             *extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
        self.output: list[str] = []
        self.health: dict = {}
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def wait_ready(self, timeout: float = 180.0) -> dict:
        """Poll /health until it answers 200; returns its body (fails with the server's output)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "".join(self.output)
            try:
                r = httpx.get(f"{self.base_url}/health", timeout=2)
                if r.status_code == 200:
                    return r.json()
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("server not ready:\n" + "".join(self.output))

    def stop(self) -> None:
        """Kill the server if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
