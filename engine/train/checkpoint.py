"""Resumable training checkpoints: trainable weights, optimizer state and the loop state.

Layout: ``<out>/checkpoints/step_NNNNNNN/{weights,optimizer}.safetensors + state.json``. A
checkpoint is written into a ``.tmp`` directory and renamed, so a crash mid-write leaves the
previous one intact. The data order and anchors are pure functions of (seed, step), so the step
number alone fixes the data position: a resumed run replays exactly the batches it would have seen.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

CHECKPOINT_DIR = "checkpoints"
_PREFIX = "step_"


class CheckpointError(ValueError):
    """A checkpoint does not match the drafter being trained."""


def checkpoint_root(out: Path) -> Path:
    """Directory holding the checkpoints of a run."""
    return out / CHECKPOINT_DIR


def save_checkpoint(out: Path, step: int, model: nn.Module, optimizer: optim.Optimizer, state: dict,
                    keep: int = 2) -> Path:
    """Write checkpoint ``step`` and keep only the newest ``keep``; returns its directory."""
    root = checkpoint_root(out)
    final = root / f"{_PREFIX}{step:07d}"
    tmp = root / f"{_PREFIX}{step:07d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    mx.save_safetensors(str(tmp / "weights.safetensors"), dict(tree_flatten(model.trainable_parameters())))
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer.state)))
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=1) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(out: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(out)
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX) and not p.name.endswith(".tmp")
            and (p / "state.json").exists()]
    return sorted(done, key=lambda p: int(p.name[len(_PREFIX):]))


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(out)
    return found[-1] if found else None


def load_checkpoint(path: Path, model: nn.Module, optimizer: optim.Optimizer) -> dict:
    """Restore weights and optimizer state in place; returns the saved loop state (with "step")."""
    weights = mx.load(str(path / "weights.safetensors"))
    expected = dict(tree_flatten(model.trainable_parameters()))
    if set(weights) != set(expected) or any(weights[k].shape != expected[k].shape for k in expected):
        raise CheckpointError(f"checkpoint {path} does not match this drafter's trainable weights "
                              "(different layers, block size, heads or taps?)")
    model.update(tree_unflatten(list(weights.items())))
    optimizer.state = tree_unflatten(list(mx.load(str(path / "optimizer.safetensors")).items()))
    mx.eval(model.parameters(), optimizer.state)
    return json.loads((path / "state.json").read_text())
