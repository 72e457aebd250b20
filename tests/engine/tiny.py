"""Tiny in-process targets and drafters for engine tests (float32, CPU, fixed seeds).

Drafters: a real random DSpark drafter (Markov + confidence heads), its Gemma-4 counterpart
(DeepSpec Gemma4DSparkModel), a real random z-lab DFlash drafter bound to the target, an oracle that drafts the target's own greedy continuation (all
drafts accepted), and an always-wrong one (never accepted at greedy).
"""

from __future__ import annotations

import engine  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from engine.models.drafter import Drafter
from engine.models.drafter_config import normalize_drafter_config
from engine.models.target import Target
from tests.engine import drafter_fixtures as fx
from tests.engine import gemma_drafter_fixtures as gx

VOCAB, HIDDEN, TARGET_LAYERS, BLOCK = fx.VOCAB, fx.HIDDEN, fx.TARGET_LAYERS, fx.BLOCK


def tiny_target_model(seed: int = 0, vocab: int = VOCAB, scale: float = 1.0) -> nn.Module:
    """A 4-layer llama with hidden 64 and random weights; `scale` sharpens its distributions."""
    args = llama.ModelArgs(model_type="llama", hidden_size=HIDDEN, num_hidden_layers=TARGET_LAYERS,
                           intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, rms_norm_eps=1e-5, vocab_size=vocab, rope_theta=10000.0,
                           tie_word_embeddings=False)
    mx.random.seed(seed)
    model = llama.Model(args)
    if scale != 1.0:
        model.lm_head.weight = model.lm_head.weight * scale
    mx.eval(model.parameters())
    return model


def tiny_target(seed: int = 0, scale: float = 1.0) -> Target:
    """Target wrapper over `tiny_target_model` tapping the fixtures' layers."""
    return Target(tiny_target_model(seed, scale=scale), tuple(fx.TAPS))


def _random_drafter(raw: dict, shapes: dict, seed: int) -> Drafter:
    cfg = normalize_drafter_config(raw)
    drafter = Drafter(cfg)
    weights = fx.random_weights(shapes, seed)
    drafter.load_weights(list(weights.items()), strict=True)
    mx.eval(drafter.parameters())
    return drafter


def dspark_drafter(seed: int = 3, **config) -> Drafter:
    """Random DeepSpec-layout drafter (Markov rank 8, confidence head), float32."""
    return _random_drafter(fx.deepspec_config(**config), fx.deepspec_shapes(), seed)


def gemma_drafter(seed: int = 5, **config) -> Drafter:
    """Random Gemma-4 DSpark drafter sized for `tiny_target` (K = V, soft cap 30, Markov rank 8), float32."""
    raw = gx.gemma4_dspark_config(hidden_size=HIDDEN, num_target_layers=TARGET_LAYERS, vocab_size=VOCAB,
                                  target_layer_ids=fx.TAPS, **config)
    drafter = Drafter(normalize_drafter_config(raw))
    drafter.load_weights(list(gx.gemma4_dspark_weights(raw, seed).items()), strict=True)
    mx.eval(drafter.parameters())
    return drafter


def dflash_drafter(target: Target, seed: int = 4) -> Drafter:
    """Random z-lab-layout drafter bound to the target's embedding and lm_head."""
    drafter = _random_drafter(fx.dflash_config(), fx.backbone_shapes(), seed)
    return drafter.bind_target_model(target.model)


class OracleDrafter:
    """Duck-typed drafter whose drafts are the target's greedy continuation (shift != 0: wrong).

    It recomputes the target over the committed tokens without a cache, so it is slow but exact.
    With `reference` (prompt + a known greedy output) it replays that instead, corrupting every
    draft whose position p satisfies p % corrupt_every == 0: mixed acceptance at no model cost.
    `committed` must be the decoder's list (assign after constructing the decoder).
    """

    has_markov = False
    has_confidence = False

    def __init__(self, target: Target, shift: int = 0, reference: list[int] | None = None,
                 corrupt_every: int = 0, vocab: int = VOCAB):
        self.target, self.shift, self.committed = target, shift, None
        self.reference, self.corrupt_every, self.vocab = reference, corrupt_every, vocab
        self.config = normalize_drafter_config(fx.deepspec_config())

    def _continuation(self) -> list[int]:
        start, n = len(self.committed), self.config.block_size
        if self.reference is None:
            ids = list(self.committed)
            for _ in range(n):
                ids.append(mx.argmax(self.target.model(mx.array([ids]))[0, -1]).item())
            return ids[start:]
        out = (self.reference[start : start + n] + [0] * n)[:n]
        every = self.corrupt_every
        return [(t + 1) % self.vocab if every and (start + i) % every == 0 else t for i, t in enumerate(out)]

    def make_cache(self):
        return [0]

    @staticmethod
    def context_length(cache) -> int:
        return cache[0]

    def backbone(self, ctx_new, block_ids, cache):
        cache[0] += 0 if ctx_new is None else ctx_new.shape[1]
        drafts = [(t + self.shift) % self.vocab for t in self._continuation()]
        return mx.array(drafts)[None]  # "h" rows hold the draft ids; base_logits makes them one-hot

    def draft_hidden(self, h):
        return h

    def base_logits(self, h):
        return 100.0 * (mx.arange(self.vocab) == h[..., None]).astype(mx.float32)  # [.., V]


# ---------------------------------------------------------------- the exact-distribution tests' models

# Small enough to enumerate every sequence of a few tokens (tests/engine/joint.py).
LOSSLESS_VOCAB = 6


def lossless_target(taps: bool = True) -> Target:
    """The exact-distribution tests' target: `tiny_target_model` over 6 tokens, seed 7, its logits
    scaled x3 for varied, non-uniform distributions; tapped unless `taps` is False (lookup)."""
    model = tiny_target_model(seed=7, vocab=LOSSLESS_VOCAB, scale=3.0)
    return Target(model, tuple(fx.TAPS)) if taps else Target(model)


def lossless_drafter() -> Drafter:
    """The exact-distribution tests' random DSpark drafter over 6 tokens, with a strong Markov bias
    (its second Markov matrix scaled x8), so that the draft chain matters."""
    cfg = normalize_drafter_config(fx.deepspec_config(vocab_size=LOSSLESS_VOCAB, mask_token_id=LOSSLESS_VOCAB - 1))
    mx.random.seed(11)
    drafter = Drafter(cfg)
    drafter.markov_head.markov_w2.weight = drafter.markov_head.markov_w2.weight * 8.0
    mx.eval(drafter.parameters())
    return drafter
