"""Build the drafter to train from the target, and save it in its checkpoint layout.

Embedding and lm_head are the target's and stay frozen (docs/method.md §8): a ``deepspec`` layout drafter
gets frozen copies (saved with it), the ``compact`` and ``zlab`` layouts bind the target's own
modules (nothing to save). Either way `trainable_parameters()` is exactly the backbone and heads.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from engine.loading.drafter import save_drafter
from engine.models.drafter import Drafter
from engine.models.drafter_config import DrafterConfig


def init_drafter(cfg: DrafterConfig, target_model: nn.Module, seed: int = 0) -> Drafter:
    """A freshly initialised float32 drafter tied to ``target_model``'s embedding and lm_head."""
    mx.random.seed(seed)
    drafter = Drafter(cfg)
    if drafter.has_markov:
        # Zero W2: the Markov bias starts at 0, so the untrained drafter is the plain backbone.
        drafter.markov_head.markov_w2.weight = mx.zeros_like(drafter.markov_head.markov_w2.weight)
    if cfg.owns_embeddings:
        _copy_frozen_embeddings(drafter, target_model)
    else:
        drafter.bind_target_model(target_model)
    drafter.set_dtype(mx.float32)
    mx.eval(drafter.parameters())
    return drafter


def _copy_frozen_embeddings(drafter: Drafter, target_model: nn.Module) -> None:
    inner = getattr(target_model, "model", target_model)
    drafter.embed_tokens.weight = mx.array(inner.embed_tokens.weight)
    drafter.embed_tokens.freeze()
    if not drafter.config.tie_word_embeddings:
        head = getattr(target_model, "lm_head", None)
        weight = head.weight if head is not None else inner.embed_tokens.weight
        drafter.lm_head.weight = mx.array(weight)
        drafter.lm_head.freeze()


def num_trainable(drafter: Drafter) -> int:
    """Trainable parameter count (backbone and heads)."""
    from mlx.utils import tree_flatten

    return sum(v.size for _, v in tree_flatten(drafter.trainable_parameters()))


def save_trained(drafter: Drafter, cfg: DrafterConfig, out: Path, dtype: str, extra: dict | None = None) -> Path:
    """config.json + model.safetensors in ``cfg``'s layout (loadable by `load_drafter` unchanged)."""
    return save_drafter(drafter, cfg, out, dtype, extra_config=extra)
