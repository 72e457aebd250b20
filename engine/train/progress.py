"""Training progress on a text stream (stderr): one line rewritten in place on a terminal,
periodic plain lines otherwise (logs, CI), so long runs stay readable in both."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_entry(entry: dict, total: int) -> str:
    """One status line from a history entry (see `engine.train.loop`)."""
    parts = [f"step {entry['step']}/{total}"]
    if entry.get("phase"):
        parts.append(entry["phase"])
    parts.append(f"loss {entry['loss']:.4f}")
    for key in ("ce", "kd", "hidden", "tv", "conf"):
        if entry.get(key) is not None:
            parts.append(f"{key} {entry[key]:.3f}")
    if entry.get("acc"):
        parts.append("acc " + " ".join(f"{a:.2f}" for a in entry["acc"]))
        parts.append(f"tau~{entry['tau_est']:.2f}")
    if entry.get("greedy_acc"):
        parts.append("greedy " + " ".join(f"{a:.2f}" for a in entry["greedy_acc"]))
        parts.append(f"tau~{entry['greedy_tau_est']:.2f}")
    parts += [f"lr {entry['lr']:.2e}", f"{entry['tok_s']:.0f} anchor-tok/s"]
    if entry.get("eta_s") is not None:
        parts.append(f"eta {_duration(entry['eta_s'])}")
    return " | ".join(parts)


class ProgressBar:
    """Reports training steps; `tty=None` asks the stream whether it is a terminal."""

    def __init__(self, total: int, stream: TextIO | None = None, tty: bool | None = None):
        self.total, self.stream = total, stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._last = ""
        self._t0 = time.monotonic()

    def step(self, step: int) -> None:
        """Called every step: refreshes the in-place line on a terminal (cheap; no metrics)."""
        if self.tty and self._last:
            self._write(f"\r\033[K{self._last} [{step}/{self.total}]")

    def log(self, entry: dict) -> None:
        """Called at logging steps with the averaged metrics."""
        self._last = format_entry(entry, self.total)
        self._write(f"\r\033[K{self._last}" if self.tty else self._last + "\n")

    def message(self, text: str) -> None:
        """A one-off line (checkpoint saved, evaluation started...)."""
        prefix = "\r\033[K" if self.tty else ""
        self._write(f"{prefix}[train {time.monotonic() - self._t0:7.1f}s] {text}\n")

    def close(self) -> None:
        """End the in-place line."""
        if self.tty and self._last:
            self._write("\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"
