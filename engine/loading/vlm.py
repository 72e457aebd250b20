"""Targets loaded through mlx-vlm (Gemma-4 and other vision-language models).

The engine drafts and verifies on the language model alone (`Model.language_model`); the whole
model and its processor are kept for the images of a prompt (engine/vision.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import mlx.core as mx

from engine.vision import Vision, vision_for

log = logging.getLogger(__name__)


def is_vlm_dir(path: Path) -> bool:
    """Whether `path` holds an mlx-vlm model: its config.json carries a vision tower's config."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def load_vlm(path: Path) -> tuple[Any, Any, Vision | None]:
    """(language model, tokenizer, Vision or None) of the mlx-vlm model in `path`, float32 on the CPU."""
    try:
        from mlx_vlm.utils import load
    except ImportError as exc:
        raise ImportError(f"{path} is a vision-language model: install mlx-vlm (pip install 'dspark-serve[vlm]')") from exc
    from engine.loading.target import prefer_float32_on_cpu

    model, processor = load(str(path))
    prefer_float32_on_cpu(model)
    mx.eval(model.parameters())
    vision = vision_for(model, processor)
    if vision is None:
        log.warning("%s: images are not supported for %s models yet; serving it text-only", path,
                    getattr(model, "model_type", "these"))
    return model.language_model, text_tokenizer(processor), vision


def text_tokenizer(processor: Any):
    """mlx-lm's tokenizer wrapper (streaming detokenizer, end ids) over the processor's tokenizer,
    with the processor's chat template when the tokenizer has none of its own."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    hf = getattr(processor, "tokenizer", processor)
    if not getattr(hf, "chat_template", None) and getattr(processor, "chat_template", None):
        hf.chat_template = processor.chat_template
    return TokenizerWrapper(hf)
