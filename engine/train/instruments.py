"""Training instruments and the go/no-go gate (issue 18).

Every ``instrument_every`` steps the `Monitor` measures, on a fixed held-out batch:
  * ``residual_norm``: mean L2 norm of the block stream after the embedding and after each layer
    (a stream that grows far past the embedding's norm drowns the anchor's identity), and
    ``residual_constant_share``: the share of its energy in the mean row (a constant vector);
  * ``anchor_swap``: how much the base logits (no Markov bias) of draft position 1 move when the
    anchor is replaced by a random token: mean |delta| of the row-centred logits and the total
    variation between the two distributions (near 0: the backbone ignores its anchor);
  * ``greedy_match``: teacher-forced held-out greedy match by position (draft argmax = target
    argmax, teacher-forced previous tokens) and the tau estimate built from it;
  * the same with the context zeroed (``greedy_match_zero_context``): what the taps contribute.
The gate: once the early (position-curriculum) phases have used ``gate_core_hours`` of CPU time, or
when they end if sooner, the held-out match at position 1 must reach ``gate_min_match``; otherwise
the run checkpoints and stops with `GateFailed`, whose verdict the pipeline writes to training.json.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from engine.models.drafter import draft_logits
from engine.train.batch import BlockBatch
from engine.train.data import Sample
from engine.train.evaluate import zeroed_context
from engine.train.features import FeatureSource
from engine.train.forward import draft_rows, train_backbone
from engine.train.loss import acceptance_estimate
from engine.train.recipe import phase_at


class GateFailed(RuntimeError):
    """The go/no-go gate failed; ``verdict`` holds the numbers (also saved in the checkpoint)."""

    def __init__(self, verdict: dict):
        super().__init__(verdict["reason"])
        self.verdict = verdict


def residual_norms(trainer, batch: BlockBatch) -> tuple[list[float], list[float]]:
    """After the embedding and after each layer [L + 1]: the block stream's mean row norm, and the
    share of its energy in the mean row (near 1: one constant vector, the trap the review describes)."""
    trace: list[mx.array] = []
    train_backbone(trainer.drafter, batch.taps, batch.block_ids, batch.anchors, batch.attn_mask, trace)
    norms, shares = [], []
    for x in trace:
        rows = x.reshape(-1, x.shape[-1])  # [b*N*Bs, d]
        energy = (rows * rows).sum(axis=-1).mean()
        mean = rows.mean(axis=0)
        norms.append(float(mx.sqrt((rows * rows).sum(axis=-1)).mean().item()))
        shares.append(float(((mean * mean).sum() / energy).item()))
    return norms, shares


def anchor_swap(trainer, batch: BlockBatch, seed: int = 0) -> dict:
    """Movement of the position-1 base logits when every anchor is replaced by a random token."""
    drafter = trainer.drafter
    first = mx.array(np.nonzero(batch.position == 0)[0].astype(np.int32))  # [R1] rows of draft position 1
    vocab = drafter.config.vocab_size
    swapped_ids = np.array(batch.block_ids)
    swapped_ids[:, 0] = np.random.default_rng([seed, 17]).integers(0, vocab, size=swapped_ids.shape[0])
    outs = []
    for ids in (batch.block_ids, mx.array(swapped_ids)):
        h = train_backbone(drafter, batch.taps, ids, batch.anchors, batch.attn_mask)
        logits = drafter.base_logits(draft_rows(drafter, h, batch.rows)[first])  # [R1, V]
        outs.append(logits - logits.mean(axis=-1, keepdims=True))
    delta = mx.abs(outs[0] - outs[1]).mean()
    tv = 0.5 * mx.abs(mx.softmax(outs[0], axis=-1) - mx.softmax(outs[1], axis=-1)).sum(axis=-1).mean()
    return {"mean_abs_logit_delta": float(delta.item()), "tv": float(tv.item())}


def greedy_match(trainer, batches: list[BlockBatch]) -> dict:
    """Teacher-forced greedy match by position and its tau estimate over ``batches``.

    Over the whole vocabulary, as served. When the run trains on a shortlist, ``outside_shortlist``
    is the share of draft argmaxes that fall outside it (tokens the KD never pushed down).
    """
    matches, positions, blocks, argmaxes, offset = [], [], [], [], 0
    for batch in batches:
        h_rows = draft_rows(trainer.drafter, train_backbone(trainer.drafter, batch.taps, batch.block_ids,
                                                            batch.anchors, batch.attn_mask), batch.rows)
        logits = draft_logits(trainer.drafter, h_rows, batch.prev_ids)  # [R, V]
        top = mx.argmax(logits, axis=-1)  # [R]
        match = top == _target_argmax(trainer, batch)
        matches.append(np.array(match.astype(mx.float32)))
        argmaxes.append(np.array(top))
        positions.append(batch.position)
        blocks.append(batch.block + offset)
        offset += batch.num_blocks
    per_pos, tau = acceptance_estimate(np.concatenate(matches), np.concatenate(positions),
                                       np.concatenate(blocks), offset, batches[0].num_drafts)
    out = {"by_position": [round(a, 4) for a in per_pos], "tau_estimate": round(tau, 4)}
    shortlist = getattr(trainer, "shortlist", None)
    if shortlist is not None:
        out["outside_shortlist"] = round(float(np.mean(~np.isin(np.concatenate(argmaxes), shortlist))), 4)
    return out


def _target_argmax(trainer, batch: BlockBatch) -> mx.array:
    # The cached top-1 when there is one, else the target head on the row's hidden state.
    if batch.teacher is not None:
        return batch.teacher.ids[:, 0]
    hidden = batch.hidden.reshape(-1, batch.hidden.shape[-1])[batch.target_rows]
    return mx.argmax(trainer.target_head(hidden), axis=-1)


class Monitor:
    """Periodic instruments on held-out samples, and the go/no-go gate, for one `Trainer`."""

    def __init__(self, samples: list[Sample], features: FeatureSource, every: int, seed: int = 0):
        self.samples, self.features, self.every, self.seed = samples, features, every, seed
        self._batches: list[BlockBatch] | None = None

    def batches(self, trainer) -> list[BlockBatch]:
        """The fixed held-out batches (one per sample, seeded anchors), built once."""
        if self._batches is None:
            # Whole-vocabulary batches (no shortlist columns): the instruments measure what serving drafts.
            self._batches = [trainer.batch_of(self.features, self.samples, [i],
                                              np.random.default_rng([self.seed, 19, i]), shortlist=False)
                             for i in range(len(self.samples))]
        return self._batches

    def measure(self, trainer, step: int) -> dict:
        """One instrument report at ``step``."""
        batches = self.batches(trainer)
        report = {"step": step, "greedy_match": greedy_match(trainer, batches)}
        with zeroed_context(trainer.drafter):
            report["greedy_match_zero_context"] = greedy_match(trainer, batches)
        norms, shares = residual_norms(trainer, batches[0])
        report["residual_norm"] = [round(v, 3) for v in norms]
        report["residual_constant_share"] = [round(v, 4) for v in shares]
        report["anchor_swap"] = {k: round(v, 4) for k, v in anchor_swap(trainer, batches[0], self.seed).items()}
        return report

    def after_step(self, trainer, result) -> None:
        """Instruments every ``every`` steps; the gate once its clock has run out (may raise)."""
        cfg, step = trainer.cfg, result.step
        report = None
        if self.every and step % self.every == 0:
            report = self.measure(trainer, step)
            result.instruments.append(report)
            trainer.progress.message(_describe(report))
        if result.gate is None and self._gate_due(cfg, result):
            report = report or self.measure(trainer, step)
            result.gate = _verdict(cfg, result, report)
            trainer.progress.message(result.gate["reason"])
            trainer._save(result)
            if not result.gate["passed"]:
                raise GateFailed(result.gate)

    @staticmethod
    def _gate_due(cfg, result) -> bool:
        if cfg.gate_core_hours <= 0 or cfg.objective != "kd":
            return False
        ended = not phase_at(cfg, result.step).early or result.step == cfg.steps
        return result.early_cpu_s >= cfg.gate_core_hours * 3600 or (ended and result.early_cpu_s > 0)


def _verdict(cfg, result, report: dict) -> dict:
    first = report["greedy_match"]["by_position"][0]
    passed = first >= cfg.gate_min_match
    hours = result.early_cpu_s / 3600
    word = "passed" if passed else "failed"
    reason = (f"gate {word} at step {result.step} after {hours:.2f} core-hours of the early phase: teacher-forced "
              f"held-out greedy match at position 1 is {first:.3f} (threshold {cfg.gate_min_match}; run 3 had 0.31); "
              f"zero-context {report['greedy_match_zero_context']['by_position'][0]:.3f}, residual norms "
              f"{report['residual_norm']}, anchor-swap TV {report['anchor_swap']['tv']}")
    return {"passed": passed, "step": result.step, "early_core_hours": round(hours, 3), "match_position_1": first,
            "threshold": cfg.gate_min_match, "report": report, "reason": reason}


def _describe(report: dict) -> str:
    gm, zc = report["greedy_match"], report["greedy_match_zero_context"]
    outside = f" (argmax outside the shortlist {gm['outside_shortlist']:.3f})" if "outside_shortlist" in gm else ""
    return (f"instruments @ {report['step']}: held-out greedy " + " ".join(f"{a:.2f}" for a in gm["by_position"])
            + f" tau~{gm['tau_estimate']:.2f}{outside} | zero-context " + " ".join(f"{a:.2f}" for a in zc["by_position"])
            + f" | residual norm {report['residual_norm']} (constant share {report['residual_constant_share']})"
            + f" | anchor swap {report['anchor_swap']}")
