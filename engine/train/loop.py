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
from engine.train.batch import BlockBatch, build_batch, gather_teacher, sample_anchors
from engine.train.config import TrainConfig
from engine.train.data import Sample
from engine.train.features import FeatureSource, mean_hidden
from engine.train.forward import draft_rows, train_backbone
from engine.train.loss import HeadFn, acceptance_estimate, block_losses, kd_losses
from engine.train.order import make_order
from engine.train.progress import ProgressBar
from engine.train.recipe import Phase, phase_at
from engine.train.shortlist import batch_columns, frequent_tokens


HIDDEN_STAT_SAMPLES = 64  # samples the target's mean final state is measured on


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
    cpu_s: float = 0.0  # process CPU time in the loop (core-seconds), summed over resumed runs
    early_cpu_s: float = 0.0  # of which in the early (position-curriculum) phases: the gate's clock
    instruments: list[dict] = field(default_factory=list)  # periodic reports (engine.train.instruments)
    gate: dict | None = None  # the go/no-go verdict once taken


def make_optimizer(cfg: TrainConfig) -> optim.AdamW:
    """AdamW with linear warm-up to ``lr`` then cosine decay to ``min_lr_frac * lr`` at ``steps``."""
    warm = cfg.warmup_steps
    decay = optim.cosine_decay(cfg.lr, max(1, cfg.steps - warm), cfg.lr * cfg.min_lr_frac)
    schedule = optim.join_schedules([optim.linear_schedule(0.0, cfg.lr, warm), decay], [warm])
    return optim.AdamW(learning_rate=schedule, betas=[0.9, cfg.beta2], weight_decay=cfg.weight_decay)


def _zeros_like_tree(tree):
    if isinstance(tree, dict):
        return {k: _zeros_like_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_zeros_like_tree(v) for v in tree]
    return mx.zeros_like(tree)


def _blend(before, after, mult: float):
    # before + mult * (after - before), leaf by leaf.
    if isinstance(after, dict):
        return {k: _blend(before[k], v, mult) for k, v in after.items()}
    if isinstance(after, list):
        return [_blend(b, a, mult) for b, a in zip(before, after)]
    return before + mult * (after - before)


class Trainer:
    """Owns the drafter, optimizer and data for one run; `run` trains to ``cfg.steps``."""

    def __init__(self, cfg: TrainConfig, drafter: Drafter, target_head: HeadFn, features: FeatureSource,
                 samples: list[Sample], progress: ProgressBar | None = None):
        self.cfg, self.drafter, self.target_head = cfg, drafter, target_head
        self.features, self.samples = features, samples
        self.progress = progress or ProgressBar(cfg.steps)
        self.optimizer = make_optimizer(cfg)
        self.order = make_order(cfg, len(samples), features.chunk)
        self._grad_fn = nn.value_and_grad(drafter, self._loss)
        self.monitor = None  # engine.train.instruments.Monitor: periodic instruments and the gate
        self.hidden_center = None  # [d] the target's mean final state (kd's hidden regression centre)
        if cfg.objective == "kd" and cfg.hidden_center == "mean":
            self.hidden_center = mean_hidden(features, min(HIDDEN_STAT_SAMPLES, len(samples)))
        self.shortlist = None  # [S] int32 sorted ids: the KD's frequent-token columns (engine.train.shortlist)
        if cfg.objective == "kd" and cfg.shortlist > 0:
            self.shortlist = frequent_tokens(samples, cfg.shortlist, drafter.config.vocab_size)

    # ------------------------------------------------------------ one step

    def make_batch(self, step: int, max_position: int | None = None) -> BlockBatch:
        """The anchor blocks of ``step`` (deterministic in (seed, step)), draft positions <= max_position."""
        return self.batch_of(self.features, self.samples, self.order.indices(step),
                             np.random.default_rng([self.cfg.seed, 3, step]), max_position)

    def batch_of(self, features: FeatureSource, samples: list[Sample], idx: list[int], rng: np.random.Generator,
                 max_position: int | None = None, shortlist: bool = True) -> BlockBatch:
        """The anchor blocks of samples ``idx`` of ``features`` (with the teacher when the objective is kd,
        and the shortlist's loss columns when the run has one and ``shortlist``)."""
        taps, hidden = features.batch(idx)
        chosen = [samples[i] for i in idx]
        anchors = np.stack([sample_anchors(s, self.cfg.anchors, rng) for s in chosen])
        dcfg = self.drafter.config
        batch = build_batch(chosen, taps, hidden, anchors, block_slots=dcfg.block_size,
                            slot_offset=dcfg.draft_slot_offset, mask_token_id=dcfg.mask_token_id,
                            decay=self.cfg.loss_decay, max_position=max_position)
        if self.cfg.objective == "kd":
            batch.teacher = gather_teacher(*features.teacher(idx), batch.target_rows)
            if shortlist and self.shortlist is not None:
                batch.columns = batch_columns(self.shortlist, batch.teacher, np.array(batch.labels))
        return batch

    def _loss(self, batch: BlockBatch, phase: Phase, with_target: bool) -> tuple[mx.array, dict]:
        h = train_backbone(self.drafter, batch.taps, batch.block_ids, batch.anchors, batch.attn_mask)
        h_rows = draft_rows(self.drafter, h, batch.rows)  # [R, d]
        w = phase.weights
        if self.cfg.objective != "kd":
            alphas = (w["ce"], w["tv"], w["conf"])
            return block_losses(self.drafter, self.target_head, h_rows, batch, alphas, with_target)
        total, parts = kd_losses(self.drafter, h_rows, batch, batch.teacher, w, self.hidden_center)
        if w.get("tv", 0.0) > 0 or w.get("conf", 0.0) > 0:
            extra, more = block_losses(self.drafter, self.target_head, h_rows, batch,
                                       (0.0, w.get("tv", 0.0), w.get("conf", 0.0)), True)
            total = total + extra
            parts.update({k: v for k, v in more.items() if k not in parts})
        return total, parts

    def train_step(self, step: int, with_target: bool) -> tuple[BlockBatch, dict]:
        """One optimizer step; returns the batch and the evaluated loss parts (+ grad_norm)."""
        phase = phase_at(self.cfg, step)
        batch = self.make_batch(step, phase.max_position)
        (loss, parts), grads = self._grad_fn(batch, phase, with_target)
        if phase.markov_mult == 0 and "markov_head" in grads:
            grads["markov_head"] = _zeros_like_tree(grads["markov_head"])  # frozen: no Adam moments either
        grads, grad_norm = optim.clip_grad_norm(grads, self.cfg.grad_clip)
        before = self._markov_params() if phase.markov_mult != 1 else None
        self.optimizer.update(self.drafter, grads)
        if before is not None:
            self._scale_markov_update(before, phase.markov_mult)
        mx.eval(self.drafter.trainable_parameters(), self.optimizer.state, loss, parts, grad_norm)
        return batch, {**parts, "loss": loss, "grad_norm": grad_norm}

    def _markov_params(self) -> dict | None:
        head = getattr(self.drafter, "markov_head", None)
        return dict(head.trainable_parameters()) if head is not None else None

    def _scale_markov_update(self, before: dict | None, mult: float) -> None:
        # A per-module learning rate with one optimizer: keep mult x the step the optimizer took.
        if before is None:
            return
        head = self.drafter.markov_head
        after = head.trainable_parameters()
        head.update(_blend(before, after, mult))

    def evaluate_batch(self, batch: BlockBatch) -> dict:
        """Loss parts without a gradient (held-out estimate): the full-target ce / tv / conf terms,
        whatever the objective, so estimates stay comparable across recipes."""
        alphas = self.cfg.loss_weights if self.cfg.objective != "kd" else (1.0, 0.0, 1.0)
        h = train_backbone(self.drafter, batch.taps, batch.block_ids, batch.anchors, batch.attn_mask)
        h_rows = draft_rows(self.drafter, h, batch.rows)  # [R, d]
        loss, parts = block_losses(self.drafter, self.target_head, h_rows, batch, alphas, True)
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
            t0, c0 = time.perf_counter(), time.process_time()
            log_now = (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps
            batch, parts = self.train_step(step, with_target=alphas[1] > 0 or alphas[2] > 0 or log_now)
            dt = time.perf_counter() - t0
            meter.add(batch, parts, dt)
            result.step, result.train_s = step + 1, result.train_s + dt
            cpu = time.process_time() - c0
            result.cpu_s += cpu
            result.early_cpu_s += cpu if phase_at(cfg, step).early else 0.0
            result.anchor_tokens += int(batch.rows.shape[0])
            self.progress.step(step + 1)
            if log_now:
                self._log(meter, result)
                meter = _Meter()
            if self.monitor is not None:
                self.monitor.after_step(self, result)  # may checkpoint and raise GateFailed
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
        entry["phase"] = phase_at(self.cfg, result.step - 1).name
        entry["cpu_s"] = round(result.cpu_s, 1)
        entry["eta_s"] = (self.cfg.steps - result.step) * entry["step_s"]
        result.history.append(entry)
        self.progress.log(entry)

    def _save(self, result: LoopResult) -> None:
        state = {"history": result.history, "train_s": result.train_s, "anchor_tokens": result.anchor_tokens,
                 "seed": self.cfg.seed, "samples_seen": result.step * self.cfg.batch, "cpu_s": result.cpu_s,
                 "early_cpu_s": result.early_cpu_s, "instruments": result.instruments, "gate": result.gate,
                 "num_samples": len(self.samples)}
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
                          resumed_from=int(state["step"]), cpu_s=float(state.get("cpu_s", 0.0)),
                          early_cpu_s=float(state.get("early_cpu_s", 0.0)),
                          instruments=list(state.get("instruments", [])), gate=state.get("gate"))


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
        for key in ("loss", "ce", "tv", "conf", "kd", "hidden", "grad_norm"):
            if key in parts:
                self.sums[key] = self.sums.get(key, 0.0) + float(parts[key].item())
                self.counts[key] = self.counts.get(key, 0) + 1
        self.steps, self.time, self.tokens = self.steps + 1, self.time + dt, self.tokens + int(batch.rows.shape[0])
        if "cstar" in parts:  # latest step's estimate (DFlash computes it only on logging steps)
            self.acc, self.tau = acceptance_estimate(np.array(parts["cstar"]), *_grid(batch))
        if "greedy_match" in parts:
            self.greedy_acc, self.greedy_tau = acceptance_estimate(np.array(parts["greedy_match"]), *_grid(batch))

    def entry(self, step: int, lr: float, elapsed: float) -> dict:
        out = {"step": step, **{k: v / self.counts[k] for k, v in self.sums.items()}}
        out.update(lr=lr, tok_s=self.tokens / self.time if self.time else 0.0, step_s=self.time / self.steps,
                   elapsed_s=round(elapsed, 2), acc=self.acc, tau_est=self.tau, greedy_acc=self.greedy_acc,
                   greedy_tau_est=self.greedy_tau)
        for key in ("ce", "tv", "conf"):
            out.setdefault(key, None)
        return out


def _grid(batch: BlockBatch) -> tuple:
    return batch.position, batch.block, batch.num_blocks, batch.num_drafts
