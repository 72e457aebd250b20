"""Fixtures shared by the engine tests."""

from __future__ import annotations

import os

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


# `make lossless-prefix`: the exact-distribution tests with every prompt read from the prefix cache.
PREFIX_SWITCH = "DSPARK_LOSSLESS_PREFIX"
LOSSLESS_MODULES = ("test_lossless", "test_hybrid_lossless")


@pytest.fixture(autouse=True)
def _prompts_from_the_prefix_cache(request, monkeypatch):
    """With DSPARK_LOSSLESS_PREFIX=1, every decoder in the exact-distribution tests restores the first
    half of its prompt from a prefix-cache state (taken from another decoder that read the whole
    prompt) and reads only the rest, so the whole losslessness suite, controls included, runs with
    the cache on. Off by default: it doubles the prompt passes and `test_lossless.py` already has a
    restored-prefix test and its control in every run."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    if os.environ.get(PREFIX_SWITCH) != "1" or not module.startswith(LOSSLESS_MODULES):
        return
    from engine.api import SpecStats
    from engine.spec import SpecDecoder

    real = SpecDecoder.read_prompt

    def read_prompt(self, prompt_ids, prefix=None, cancelled=None):
        # Duck-typed drafters of some controls keep a counter, not KV caches: nothing to capture.
        fake_cache = self.draft_cache is not None and not all(hasattr(c, "offset") for c in self.draft_cache)
        if prefix is None and len(prompt_ids) > 1 and not fake_cache:
            donor = type(self)(self.target, self.drafter, self.scheduler, self.opts, SpecStats(mode="dspark", cap=4))
            real(donor, prompt_ids)
            prefix = (donor.capture(), len(prompt_ids) // 2)
            real(self, prompt_ids, prefix, cancelled)
            assert self.stats.prompt_cached_tokens == len(prompt_ids) // 2  # the switch took effect
            return None
        return real(self, prompt_ids, prefix, cancelled)

    monkeypatch.setattr(SpecDecoder, "read_prompt", read_prompt)
