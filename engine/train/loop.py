"""The training loop: AdamW, linear warm-up + cosine decay, gradient clipping, checkpoints, resume.

Determinism is what makes resume exact: the sample order of every epoch and the anchors of every
step come from generators seeded by (seed, epoch) and (seed, step), never from running state. A
run resumed from step s therefore sees the same batches as an uninterrupted one, and ends at the
same step with the same weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from engine.models.drafter import Drafter
from engine.train import checkpoint
from engine.train.batch import BlockBatch, build_batch, sample_anchors
from engine.train.config import TrainConfig
from engine.train.data import Sample
from engine.train.features import FeatureSource
from engine.train.forward import draft_rows, train_backbone
from engine.train.loss import HeadFn, acceptance_estimate, block_losses
from engine.train.progress import ProgressBar


class TrainingStopped(RuntimeError):
    """Raised after ``stop_after`` steps of this run (simulates an interruption in tests)."""


@dataclass
class LoopResult:
    """Where the loop ended and what it logged."""

    step: int
    history: list[dict] = field(default_factory=list)
    train_s: float = 0.0  # wall time in the loop, summed over resumed runs
    anchor_tokens: int = 0  # valid draft rows trained on, summed over resumed runs
    resumed_from: int | None = None


def make_optimizer(cfg: TrainConfig) -> optim.AdamW:
    """AdamW with linear warm-up to ``lr`` then cosine decay to 0 at ``steps`` (spec §1.9)."""
    warm = cfg.warmup_steps
    schedule = optim.join_schedules(
        [optim.linear_schedule(0.0, cfg.lr, warm), optim.cosine_decay(cfg.lr, max(1, cfg.steps - warm), 0.0)],
        [warm])
    return optim.AdamW(learning_rate=schedule, weight_decay=cfg.weight_decay)


def epoch_order(num: int, chunk: int, seed: int, epoch: int) -> np.ndarray:
    """Sample order of one epoch: chunks shuffled, then samples shuffled within each chunk.

    Chunk-local order keeps consecutive steps inside one feature-cache file.
    """
    rng = np.random.default_rng([seed, 5, epoch])
    parts = []
    for c in rng.permutation((num + chunk - 1) // chunk):
        size = min(chunk, num - c * chunk)
        parts.append(c * chunk + rng.permutation(size))
    return np.concatenate(parts)


class DataOrder:
    """Sample indices of any step, as a pure function of (seed, step)."""

    def __init__(self, num: int, chunk: int, batch: int, seed: int):
        self.num, self.chunk, self.batch, self.seed = num, chunk, batch, seed
        self._orders: dict[int, np.ndarray] = {}

    def indices(self, step: int) -> list[int]:
        """The ``batch`` samples of ``step``."""
        out = []
        for pos in range(step * self.batch, (step + 1) * self.batch):
            epoch, i = divmod(pos, self.num)
            if epoch not in self._orders:
                self._orders = {epoch: epoch_order(self.num, self.chunk, self.seed, epoch)}
            out.append(int(self._orders[epoch][i]))
        return out


class Trainer:
    """Owns the drafter, optimizer and data for one run; `run` trains to ``cfg.steps``."""

    def __init__(self, cfg: TrainConfig, drafter: Drafter, target_head: HeadFn, features: FeatureSource,
                 samples: list[Sample], progress: ProgressBar | None = None):
        self.cfg, self.drafter, self.target_head = cfg, drafter, target_head
        self.features, self.samples = features, samples
        self.progress = progress or ProgressBar(cfg.steps)
        self.optimizer = make_optimizer(cfg)
        self.order = DataOrder(len(samples), features.chunk, cfg.batch, cfg.seed)
        self._grad_fn = nn.value_and_grad(drafter, self._loss)

    # ------------------------------------------------------------ one step

    def make_batch(self, step: int) -> BlockBatch:
        """The anchor blocks of ``step`` (deterministic in (seed, step))."""
        idx = self.order.indices(step)
        taps, hidden = self.features.batch(idx)
        rng = np.random.default_rng([self.cfg.seed, 3, step])
        samples = [self.samples[i] for i in idx]
        anchors = np.stack([sample_anchors(s, self.cfg.anchors, rng) for s in samples])
        dcfg = self.drafter.config
        return build_batch(samples, taps, hidden, anchors, block_slots=dcfg.block_size,
                           slot_offset=dcfg.draft_slot_offset, mask_token_id=dcfg.mask_token_id,
                           decay=self.cfg.loss_decay)

    def _loss(self, batch: BlockBatch, with_target: bool) -> tuple[mx.array, dict]:
        h = train_backbone(self.drafter, batch.taps, batch.block_ids, batch.anchors, batch.attn_mask)
        h_rows = draft_rows(self.drafter, h, batch.rows)  # [R, d]
        return block_losses(self.drafter, self.target_head, h_rows, batch, self.cfg.loss_weights, with_target)

    def train_step(self, step: int, with_target: bool) -> tuple[BlockBatch, dict]:
        """One optimizer step; returns the batch and the evaluated loss parts (+ grad_norm)."""
        batch = self.make_batch(step)
        (loss, parts), grads = self._grad_fn(batch, with_target)
        grads, grad_norm = optim.clip_grad_norm(grads, self.cfg.grad_clip)
        self.optimizer.update(self.drafter, grads)
        mx.eval(self.drafter.trainable_parameters(), self.optimizer.state, loss, parts, grad_norm)
        return batch, {**parts, "loss": loss, "grad_norm": grad_norm}

    def evaluate_batch(self, batch: BlockBatch) -> dict:
        """Loss parts without a gradient (held-out estimate)."""
        loss, parts = self._loss(batch, True)
        mx.eval(loss, parts)
        return {**parts, "loss": loss}

    # ------------------------------------------------------------ the run

    def run(self, resume: bool = False, stop_after: int | None = None, save_on_stop: bool = False) -> LoopResult:
        """Train from step 0 (or the latest checkpoint when ``resume``) to ``cfg.steps``.

        ``stop_after`` ends this invocation after that many steps by raising `TrainingStopped`;
        with ``save_on_stop`` it first checkpoints (a planned pause), otherwise it behaves like a
        crash and a resume restarts from the last periodic checkpoint.
        """
        result = self._restore() if resume else LoopResult(step=0)
        meter = _Meter()
        cfg, alphas = self.cfg, self.cfg.loss_weights
        for step in range(result.step, cfg.steps):
            t0 = time.perf_counter()
            log_now = (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps
            batch, parts = self.train_step(step, with_target=alphas[1] > 0 or alphas[2] > 0 or log_now)
            dt = time.perf_counter() - t0
            meter.add(batch, parts, dt)
            result.step, result.train_s = step + 1, result.train_s + dt
            result.anchor_tokens += int(batch.rows.shape[0])
            self.progress.step(step + 1)
            if log_now:
                self._log(meter, result)
                meter = _Meter()
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
                self._save(result)
            if stop_after is not None and step + 1 < cfg.steps and step + 1 - (result.resumed_from or 0) >= stop_after:
                if save_on_stop:
                    self._save(result)
                raise TrainingStopped(f"stopped after step {step + 1} of {cfg.steps}; continue with --resume")
        self.progress.close()
        return result

    def _log(self, meter: _Meter, result: LoopResult) -> None:
        entry = meter.entry(result.step, float(self.optimizer.learning_rate), result.train_s)
        entry["eta_s"] = (self.cfg.steps - result.step) * entry["step_s"]
        result.history.append(entry)
        self.progress.log(entry)

    def _save(self, result: LoopResult) -> None:
        state = {"history": result.history, "train_s": result.train_s, "anchor_tokens": result.anchor_tokens,
                 "seed": self.cfg.seed, "samples_seen": result.step * self.cfg.batch}
        checkpoint.save_checkpoint(self.cfg.out, result.step, self.drafter, self.optimizer, state,
                                   keep=self.cfg.keep_checkpoints)

    def _restore(self) -> LoopResult:
        path = checkpoint.latest_checkpoint(self.cfg.out)
        if path is None:
            return LoopResult(step=0)
        state = checkpoint.load_checkpoint(path, self.drafter, self.optimizer)
        self.progress.message(f"resumed from {path} (step {state['step']})")
        return LoopResult(step=int(state["step"]), history=list(state.get("history", [])),
                          train_s=float(state.get("train_s", 0.0)), anchor_tokens=int(state.get("anchor_tokens", 0)),
                          resumed_from=int(state["step"]))


class _Meter:
    """Averages of the loss parts over the steps since the last log line."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}  # steps that computed each part (DFlash: tv on logging steps only)
        self.steps, self.time, self.tokens = 0, 0.0, 0
        self.acc: list[float] | None = None
        self.tau: float | None = None
        self.greedy_acc: list[float] | None = None
        self.greedy_tau: float | None = None

    def add(self, batch: BlockBatch, parts: dict, dt: float) -> None:
        for key in ("loss", "ce", "tv", "conf", "grad_norm"):
            if key in parts:
                self.sums[key] = self.sums.get(key, 0.0) + float(parts[key].item())
                self.counts[key] = self.counts.get(key, 0) + 1
        self.steps, self.time, self.tokens = self.steps + 1, self.time + dt, self.tokens + int(batch.rows.shape[0])
        if "cstar" in parts:  # latest step's estimate (DFlash computes it only on logging steps)
            args = (batch.position, batch.block, batch.num_blocks, batch.num_drafts)
            self.acc, self.tau = acceptance_estimate(np.array(parts["cstar"]), *args)
            self.greedy_acc, self.greedy_tau = acceptance_estimate(np.array(parts["greedy_match"]), *args)

    def entry(self, step: int, lr: float, elapsed: float) -> dict:
        out = {"step": step, **{k: v / self.counts[k] for k, v in self.sums.items()}}
        out.update(lr=lr, tok_s=self.tokens / self.time if self.time else 0.0, step_s=self.time / self.steps,
                   elapsed_s=round(elapsed, 2), acc=self.acc, tau_est=self.tau, greedy_acc=self.greedy_acc,
                   greedy_tau_est=self.greedy_tau)
        out.setdefault("tv", None)
        out.setdefault("conf", None)
        return out
