"""A tiny random Gemma-4 built from mlx-vlm's own model classes (text and vision towers), float32.

Its sliding-window layers see 8 positions, so a few dozen tokens cross the window edge many times;
two of its six layers share the K/V of earlier ones and every layer takes a per-layer input, as in
the small Gemma-4 releases.
"""

from __future__ import annotations

import engine  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx
import mlx.nn as nn

from engine.models.target import Target

VOCAB, HIDDEN, LAYERS, WINDOW = 300, 64, 6, 8
IMAGE_TOKEN, BOI_TOKEN, EOI_TOKEN = 290, 291, 292
TAPS = (1, 3, 4)


def tiny_gemma4(seed: int = 0, vocab: int = VOCAB, scale: float = 1.0, window: int = WINDOW) -> nn.Module:
    """An mlx-vlm Gemma-4 `Model` (language model + vision tower) with random weights; `scale`
    multiplies the tied embedding (the output head too) to sharpen its distributions; sliding-window
    layers see `window` positions."""
    from mlx_vlm.models.gemma4 import gemma4
    from mlx_vlm.models.gemma4.config import ModelConfig, TextConfig, VisionConfig

    text = TextConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, intermediate_size=128, num_attention_heads=2,
                      head_dim=16, global_head_dim=32, num_key_value_heads=1, num_global_key_value_heads=1,
                      num_kv_shared_layers=2, vocab_size=vocab, vocab_size_per_layer_input=vocab,
                      hidden_size_per_layer_input=16, sliding_window=window, sliding_window_pattern=3,
                      max_position_embeddings=4096, final_logit_softcapping=30.0)
    vision = VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=16, global_head_dim=16, patch_size=4,
                          position_embedding_size=64, pooling_kernel_size=2, default_output_length=16)
    config = ModelConfig(text_config=text, vision_config=vision, vocab_size=vocab, hidden_size=HIDDEN,
                         image_token_id=IMAGE_TOKEN, boi_token_id=BOI_TOKEN, eoi_token_id=EOI_TOKEN,
                         audio_token_id=293, boa_token_id=294, eoa_token_id=295,
                         vision_soft_tokens_per_image=16, eos_token_id=[1])
    mx.random.seed(seed)
    model = gemma4.Model(config)
    model.set_dtype(mx.float32)
    if scale != 1.0:
        emb = model.language_model.model.embed_tokens
        emb.weight = emb.weight * scale
    mx.eval(model.parameters())
    return model


def gemma_target(model: nn.Module, taps: tuple[int, ...] = TAPS, max_rollback: int = 8) -> Target:
    """Our Target over the Gemma-4's language model (a small roll-back margin, so rounds test it)."""
    return Target(model.language_model, taps, max_rollback=max_rollback)


def random_dspark_drafter(taps: tuple[int, ...] = TAPS, vocab: int = VOCAB, seed: int = 5):
    """A random DeepSpec-layout (Qwen3) DSpark drafter reading this target's taps; the Gemma-4
    layout's own drafter is tested in test_gemma_drafter.py."""
    from engine.models.drafter import Drafter
    from engine.models.drafter_config import normalize_drafter_config
    from tests.engine import drafter_fixtures as fx

    cfg = normalize_drafter_config(fx.deepspec_config(target_layer_ids=list(taps), num_target_layers=LAYERS,
                                                      vocab_size=vocab, mask_token_id=vocab - 1))
    mx.random.seed(seed)
    drafter = Drafter(cfg)
    mx.eval(drafter.parameters())
    return drafter


class TinyProcessor:
    """What engine/vision.py reads of an mlx-vlm processor: Gemma-4's own image processor (16-pixel
    images at patch 4, pooled 2x2: 4 soft tokens each), the placeholder token and the block tokens."""

    image_token_id, boi_token, eoi_token = IMAGE_TOKEN, "<boi>", "<eoi>"

    def __init__(self):
        from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4ImageProcessor

        self.image_processor = Gemma4ImageProcessor(patch_size=4, max_soft_tokens=4, pooling_kernel_size=2)
        self.tokenizer = _BlockTokens()


class _BlockTokens:
    @staticmethod
    def convert_tokens_to_ids(text: str) -> int:
        return {"<boi>": BOI_TOKEN, "<eoi>": EOI_TOKEN}[text]


def png(seed: int, size: int = 16) -> bytes:
    """A random RGB PNG of size x size pixels."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def random_dflash_drafter(model, vocab: int = VOCAB, seed: int = 4):
    """A random z-lab DFlash drafter reading this target's taps, bound to the Gemma-4's language model."""
    from engine.models.drafter import Drafter
    from engine.models.drafter_config import normalize_drafter_config
    from tests.engine import drafter_fixtures as fx

    raw = fx.dflash_config(vocab_size=vocab, num_target_layers=LAYERS)
    raw["dflash_config"] = {"mask_token_id": vocab - 1, "target_layer_ids": list(TAPS)}
    mx.random.seed(seed)
    drafter = Drafter(normalize_drafter_config(raw))
    mx.eval(drafter.parameters())
    return drafter.bind_target_model(model.language_model)


def gemma_dspark_drafter(directory, taps: tuple[int, ...] = TAPS, vocab: int = VOCAB, seed: int = 6):
    """A random Gemma-4-layout DSpark drafter for this target, written as a checkpoint under the
    published key names (tests/engine/gemma_drafter_fixtures.py) and loaded as serving loads it."""
    from engine.loading.drafter import load_drafter
    from tests.engine.gemma_drafter_fixtures import write_gemma4_dspark

    write_gemma4_dspark(directory, hidden_size=HIDDEN, num_target_layers=LAYERS, vocab_size=vocab,
                        target_layer_ids=list(taps), seed=seed, mask_token_id=vocab - 1, dtype=mx.float32)
    drafter, _ = load_drafter(str(directory), target_vocab_size=vocab, target_num_layers=LAYERS,
                              target_hidden_size=HIDDEN)
    return drafter


# A chat template in the style of multimodal HF templates: an {"type": "image"} part renders the
# image placeholder token, text parts their text.
CHAT_TEMPLATE = (
    "{% for m in messages %}<start> {{ m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %} <image> {% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
    " <end> {% endfor %}{% if add_generation_prompt %}<start> model {% endif %}"
)


def word_tokenizer(vocab: int = VOCAB):
    """A real Hugging Face fast tokenizer (wrapped as mlx-lm wraps one): id i is the word "w<i>", with
    <eos> = 1, the chat markers, the role names as the last four ids, and the image tokens at their ids."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = {"<pad>": 0, "<eos>": 1, "<start>": 2, "<end>": 3, "<image>": IMAGE_TOKEN, "<boi>": BOI_TOKEN,
               "<eoi>": EOI_TOKEN, "<unk>": 4}
    roles = {"user": vocab - 4, "assistant": vocab - 3, "model": vocab - 2, "system": vocab - 1}
    words = {f"w{i}": i for i in range(5, vocab - 4) if i not in special.values()}
    words |= roles
    core = Tokenizer(models.WordLevel({**special, **words}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Named special tokens, as Gemma's tokenizer config has them (its processor reads image_token etc.).
    named = {"image_token": "<image>", "boi_token": "<boi>", "eoi_token": "<eoi>", "start_token": "<start>",
             "end_token": "<end>"}
    hf = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
                                 extra_special_tokens=named)
    hf.chat_template = CHAT_TEMPLATE
    return TokenizerWrapper(hf)


def write_tiny_gemma_dir(directory, seed: int = 0, scale: float = 2.0):
    """Save the tiny Gemma-4 as an mlx-vlm model directory (weights, config.json, tokenizer, processor
    with its image processor and chat template), loadable by `dspark serve --model DIR`."""
    import dataclasses
    import json
    from pathlib import Path

    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4ImageProcessor, Gemma4Processor
    from mlx_vlm.utils import save_weights

    directory = Path(directory)
    model = tiny_gemma4(seed=seed, scale=scale)
    save_weights(directory, model)
    (directory / "config.json").write_text(json.dumps(dataclasses.asdict(model.config), indent=1))
    image_processor = Gemma4ImageProcessor(patch_size=4, max_soft_tokens=4, pooling_kernel_size=2)
    processor = Gemma4Processor(image_processor=image_processor, tokenizer=word_tokenizer()._tokenizer,
                                chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(directory)
    return directory
