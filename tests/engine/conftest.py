"""Fixtures shared by the engine tests."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.models.drafter import Drafter
from engine.models.drafter_config import normalize_drafter_config
from engine.models.target import Target
from tests.engine.smollm2_cases import geometry_config


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


@pytest.fixture(scope="module")
def smollm2(default_target):
    """(target, tokenizer, random DSpark drafter, random DFlash drafter) for SmolLM2."""
    model, tok = default_target
    target = Target(model, (2, 14, 26))
    drafters = []
    for layout in ("dspark", "dflash"):
        mx.random.seed(5)
        drafter = Drafter(normalize_drafter_config(geometry_config(layout)))
        if drafter.needs_target_binding:
            drafter.bind_target_model(model)
        mx.eval(drafter.parameters())
        drafters.append(drafter)
    yield target, tok, *drafters
    target._uninstall()  # the session's model is shared: leave its layers as they were
