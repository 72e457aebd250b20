"""Fixtures shared by the engine tests."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.models.drafter import Drafter


@pytest.fixture
def context_spy(monkeypatch) -> list[bool]:
    """Per call of `Drafter.project_context`, in order: True when its taps were all zeros."""
    calls: list[bool] = []
    real = Drafter.project_context

    def spy(self, taps):
        calls.append(not mx.any(taps != 0).item())
        return real(self, taps)

    monkeypatch.setattr(Drafter, "project_context", spy)
    return calls
