"""Images in the prompt of an mlx-vlm target: pixels -> soft tokens -> the prompt's input embeddings.

The server renders one image placeholder token per image (`EngineInfo.image_token_id`). Here each
placeholder becomes the model's own image block (begin-of-image, one image token per soft token,
end-of-image), the processor turns the image into pixel values, and the mlx-vlm model's
`get_input_embeddings` scatters the vision tower's features into the prompt's embeddings. The
prompt is then read in one target forward with those embeddings; everything after it (drafts,
verification, roll-back) is text and runs as for any target (docs/method.md §1.4 for the caches).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from engine.api import EngineInputError, ImageInput


@dataclass
class PromptInputs:
    """The prompt's language-model inputs beside its ids: embeddings [1, P, d] and the model's
    other per-position inputs (Gemma-4: per-layer inputs, multimodal token types)."""

    embeds: mx.array
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class VisionPrompt:
    """A prompt with its images expanded: the ids the caches will hold and the inputs to read them."""

    ids: list[int]
    inputs: PromptInputs


class Vision:
    """The vision half of an mlx-vlm model: `model` is the whole mlx-vlm Model (vision tower,
    projector and language model) and `processor` its processor (for the image preprocessing)."""

    def __init__(self, model: Any, processor: Any, image_token_id: int, boi_id: int | None, eoi_id: int | None):
        self.model, self.processor = model, processor
        self.image_token_id, self.boi_id, self.eoi_id = image_token_id, boi_id, eoi_id

    def expand(self, prompt_ids: list[int], images: tuple[ImageInput, ...]) -> VisionPrompt:
        """prompt_ids with one placeholder per image -> the expanded ids and their input embeddings."""
        pixels, counts = self._preprocess(images)
        ids = self._splice(prompt_ids, counts)
        batch = mx.array([ids])  # [1, P]
        features = self.model.get_input_embeddings(input_ids=batch, pixel_values=pixels)
        extra = {"mm_token_type_ids": (batch == self.image_token_id).astype(mx.int32)}
        if getattr(features, "per_layer_inputs", None) is not None:
            extra["per_layer_inputs"] = features.per_layer_inputs
        return VisionPrompt(ids, PromptInputs(features.inputs_embeds, extra))

    def _preprocess(self, images: tuple[ImageInput, ...]) -> tuple[Any, list[int]]:
        """Pixel values (an array [k, 3, h, w], or a list when sizes differ) and soft tokens per image."""
        data, counts = self.processor.image_processor([decode_image(image) for image in images])
        pixels = data["pixel_values"]
        pixels = mx.array(pixels) if isinstance(pixels, np.ndarray) else [mx.array(p)[None] for p in pixels]
        return pixels, [int(n) for n in counts]

    def _splice(self, prompt_ids: list[int], counts: list[int]) -> list[int]:
        """Replace the i-th placeholder by begin-of-image, counts[i] image tokens, end-of-image."""
        out, i = [], 0
        for token in prompt_ids:
            if token != self.image_token_id:
                out.append(token)
                continue
            block = [self.image_token_id] * counts[i]
            out += ([self.boi_id] if self.boi_id is not None else []) + block + (
                [self.eoi_id] if self.eoi_id is not None else [])
            i += 1
        return out


def decode_image(image: ImageInput):
    """The RGB PIL image of an ImageInput; a clear EngineInputError for bytes that are no image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(image.data)) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise EngineInputError(f"an image could not be decoded: {exc}", param="messages") from exc


# mlx-vlm model types whose image processor returns (pixel data, soft tokens per image) and whose
# prompt marks an image as begin-of-image, one image token per soft token, end-of-image.
BLOCK_IMAGE_MODELS = ("gemma4",)


def vision_for(model: Any, processor: Any) -> Vision | None:
    """A Vision for an mlx-vlm model of BLOCK_IMAGE_MODELS with an image placeholder token; None for
    others (served text-only: their processors expand images differently)."""
    if getattr(model, "model_type", None) not in BLOCK_IMAGE_MODELS:
        return None
    tokenizer = getattr(processor, "tokenizer", None)
    image_token_id = getattr(processor, "image_token_id", None)
    if tokenizer is None or image_token_id is None or not hasattr(processor, "image_processor"):
        return None

    def token_id(name: str) -> int | None:
        text = getattr(processor, name, None)
        return tokenizer.convert_tokens_to_ids(text) if text else None

    return Vision(model, processor, int(image_token_id), token_id("boi_token"), token_id("eoi_token"))
