"""`dspark serve` in a child process on the loopback interface, for tests that drive it over HTTP.

`ServeProcess` is one server for one test module. `shared_server` is the default server shared by
every test process of a run (pytest-xdist workers included): the first to ask starts it, the last
to leave stops it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from filelock import FileLock


KEPT = ("DSPARK_CACHE", "DSPARK_BLAS_THREADS")


def clean_env() -> dict[str, str]:
    """The test environment without DSPARK_* settings (the cache location and BLAS threads excepted)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DSPARK_") or k in KEPT}


class ServeProcess:
    """`dspark serve` running in a child process; its output is collected by a thread."""

    def __init__(self, port: int, *extra_args: str) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dspark_cli.main", "serve", "--port", str(port), "--drain-grace", "20",
             *extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
        self._lines: list[str] = []
        self.health: dict = {}
        threading.Thread(target=self._collect, daemon=True).start()

    @property
    def output(self) -> list[str]:
        """The server's output lines so far."""
        return self._lines

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)

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
        """Kill the server if it still runs, and reap it. On a loaded machine a killed process can
        take more than 10 s to be gone (docs/testing.md); past 60 s the error says what state the
        kernel holds it in."""
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired as exc:
                raise AssertionError(f"server {self.proc.pid} still there 60 s after SIGKILL: "
                                     f"{_kernel_state(self.proc.pid)}") from exc


class AttachedServer:
    """A server another test process may have started: its URL, its /health at start and its log."""

    def __init__(self, base_url: str, log: Path, health: dict) -> None:
        self.base_url, self._log, self.health = base_url, log, health

    @property
    def output(self) -> list[str]:
        """The server's output lines so far (from its log file)."""
        return self._log.read_text().splitlines(keepends=True)


def _start_logged(port: int, log: Path, timeout: float = 180.0) -> tuple[int, dict]:
    """Start the default server writing to `log`, in its own session so that it outlives the test
    process that started it; (pid, /health) once it is ready."""
    with log.open("a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dspark_cli.main", "serve", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=clean_env(), start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}/health", time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == 200:
                return proc.pid, r.json()
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server not ready:\n" + log.read_text())


@contextmanager
def shared_server(root: Path, free_port: Callable[[], int]) -> Iterator[AttachedServer]:
    """The default server shared through `root` (a directory every test process of the run sees).

    A lock file orders the processes; a state file holds the server's port, pid and user count.
    The last user kills the server, so a run leaves no server behind.
    """
    state, log = root / "default-server.json", root / "default-server.log"
    with FileLock(str(root / "default-server.lock")):
        current = json.loads(state.read_text()) if state.exists() else {"users": 0}
        if current["users"] == 0:
            port = free_port()
            pid, health = _start_logged(port, log)
            current = {"port": port, "pid": pid, "health": health, "users": 0}
        current["users"] += 1
        state.write_text(json.dumps(current))
    try:
        yield AttachedServer(f"http://127.0.0.1:{current['port']}", log, current["health"])
    finally:
        with FileLock(str(root / "default-server.lock")):
            current = json.loads(state.read_text())
            current["users"] -= 1
            if current["users"] == 0:
                _kill(current["pid"])
                state.unlink()
            else:
                state.write_text(json.dumps(current))


def _kernel_state(pid: int) -> str:
    """The State and wait-channel lines the kernel gives for `pid` (Linux), for a stuck process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        return f"unreadable ({exc})"
    return "; ".join([line for line in status if line.startswith("State")] + [f"wchan {wchan}"])


def _kill(pid: int) -> None:
    """Kill the server; reap it when this process is its parent (another worker's child is reaped
    when that worker exits)."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
