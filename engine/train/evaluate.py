"""Held-out evaluation: the teacher-forced estimate, and real rounds through `SpecDecoder`.

* `heldout_estimate`: losses, mean c*_k per position and the tau estimate on held-out samples
  (same anchors machinery as training, no gradient).
* `speculative_rounds`: decode held-out prompts with the real engine loop at a fixed cap (every
  round verifies all drafts it can), returning `SpecStats` (tau = mean accepted length per round,
  conditional acceptance per position) and, for DSpark, the confidence logits of every verified
  draft with the accepted count of its round: the data of STS (docs/method.md §3.3).
* `zeroed_context`: while open, the drafter sees every context tap row as zeros. Either
  evaluation then measures the drafter on a blank context; the difference to the normal run is
  what it takes from the target's hidden states.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import numpy as np

from engine.api import SpecStats
from engine.sampling import SamplerSettings
from engine.scheduler import Scheduler
from engine.samplers import make_sampler
from engine.spec import DecodeOptions, SpecDecoder
from engine.train.batch import build_batch, sample_anchors, valid_anchors
from engine.train.data import Sample
from engine.train.features import FeatureSource
from engine.train.loss import acceptance_estimate

_LOGIT_CLAMP = 1e-15  # c in [eps, 1 - eps] before inverting the logistic


class RecordingScheduler(Scheduler):
    """Fixed cap that records c_k of every admitted draft (per round), for STS."""

    def __init__(self, cap: int, record: bool):
        super().__init__(cap)
        self.uses_confidence = record  # makes the decoder compute c_k before sampling each draft
        self.rounds: list[list[float]] = []

    def begin_round(self, limit: int) -> None:
        super().begin_round(limit)
        self.rounds.append([])

    def admit(self, k: int, confidence: float | None) -> bool:
        if k > self.round_limit:
            return False
        if confidence is not None:
            c = min(max(confidence, _LOGIT_CLAMP), 1.0 - _LOGIT_CLAMP)
            self.rounds[-1].append(math.log(c / (1.0 - c)))  # the decoder passes sigmoid(z / 1)
        return True


def speculative_rounds(target, drafter, prompts: list[list[int]], max_tokens: int, *, temperature: float = 0.0,
                       stop_ids: frozenset[int] = frozenset(), seed: int = 0,
                       cap: int | None = None) -> tuple[SpecStats, list]:
    """Decode every prompt at ``cap`` drafts per round (default: all the drafter makes).

    Returns (pooled stats, [(confidence logits, accepted, prompt index)] per round).
    """
    cap = min(cap or drafter.config.max_drafts, drafter.config.max_drafts)
    stats = SpecStats(mode="dspark" if drafter.has_markov else "dflash", cap=cap)
    record = drafter.has_confidence
    rounds: list[tuple[list[float], int, int]] = []
    settings = SamplerSettings(temperature=temperature)
    for p, prompt in enumerate(prompts):
        scheduler = RecordingScheduler(cap, record)
        opts = DecodeOptions(make_sampler(settings, "rejection", seed + p), stop_ids=stop_ids)
        decoder = SpecDecoder(target, drafter, scheduler, opts, stats)
        produced = len(decoder.prefill(list(prompt)))
        while produced < max_tokens and not decoder.done:
            before = stats.accepted_tokens
            produced += len(decoder.step(max_tokens - produced))
            if record and scheduler.rounds[-1]:
                rounds.append((scheduler.rounds[-1], stats.accepted_tokens - before, p))
    return stats, rounds


def heldout_estimate(trainer, samples: list[Sample], features: FeatureSource, anchors: int,
                     seed: int = 0) -> dict:
    """Teacher-forced held-out metrics: weighted ce/tv/conf, mean c*_k, tau estimate."""
    usable = [i for i, s in enumerate(samples) if valid_anchors(s).size]
    sums: dict[str, float] = {}
    cstars, matches, positions, blocks, offset = [], [], [], [], 0
    dcfg = trainer.drafter.config
    for i in usable:
        rng = np.random.default_rng([seed, 9, i])
        taps, hidden = features.batch([i])
        batch = build_batch([samples[i]], taps, hidden, sample_anchors(samples[i], anchors, rng)[None],
                            block_slots=dcfg.block_size, slot_offset=dcfg.draft_slot_offset,
                            mask_token_id=dcfg.mask_token_id, decay=trainer.cfg.loss_decay)
        parts = trainer.evaluate_batch(batch)
        for key in ("loss", "ce", "tv", "conf"):
            if key in parts:
                sums[key] = sums.get(key, 0.0) + float(parts[key].item())
        cstars.append(np.array(parts["cstar"]))
        matches.append(np.array(parts["greedy_match"]))
        positions.append(batch.position)
        blocks.append(batch.block + offset)
        offset += batch.num_blocks
    if not usable:
        return {}
    args = (np.concatenate(positions), np.concatenate(blocks), offset, trainer.drafter.config.max_drafts)
    per_pos, tau = acceptance_estimate(np.concatenate(cstars), *args)
    greedy_pos, greedy_tau = acceptance_estimate(np.concatenate(matches), *args)
    out = {k: v / len(usable) for k, v in sums.items()}
    return {**out, "acceptance_by_position": per_pos, "tau_estimate": tau, "greedy_acceptance_by_position": greedy_pos,
            "greedy_tau_estimate": greedy_tau, "num_samples": len(usable)}


@contextmanager
def zeroed_context(drafter) -> Iterator[None]:
    """While open, the drafter projects every context tap row as if it were all zeros.

    An instance attribute shadows `Drafter.project_context` (every context path goes through it:
    the serving cache, the reference forward, the training forward); on exit the previous state
    comes back, so blocks nest. Zero rows are not absent rows: they still take attention weight
    (keys and values of 0), so this measures the drafter on a blank context, not on none.
    """
    before = vars(drafter).get("project_context")
    real = drafter.project_context
    object.__setattr__(drafter, "project_context", lambda taps: real(mx.zeros_like(taps)))
    try:
        yield
    finally:
        if before is None:
            object.__delattr__(drafter, "project_context")
        else:
            object.__setattr__(drafter, "project_context", before)
