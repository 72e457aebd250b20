"""DSpark / DFlash drafter in MLX: parallel backbone, Markov head, confidence head (docs/method.md §3, §4).

One `Drafter` serves both checkpoint layouts and both backbone families (Qwen3; Gemma-4, whose
layer is `engine.models.gemma_drafter_layers`, whose embedding is scaled by sqrt(d) and whose base
logits are soft-capped in `Drafter.base_logits`). Per round, with batch size 1 (shapes: d = hidden,
m = taps, B = block_size, V = vocab, r = Markov rank, c = new context rows):

    cache = drafter.make_cache()                   # once per request: context K/V only
    h = drafter.backbone(ctx_new, block_ids, cache)  # ctx_new [1, c, m*d], block_ids [1, B] -> [1, B, d]
    hd = drafter.draft_hidden(h)[0]                # [max_drafts, d]; row k-1 drafts position p + k
    logits = draft_logits(drafter, hd[k-1:k], prev)  # [1, V] = U_k + B(x_{k-1}, h_k); prev [1] =
                                                   # the anchor for k = 1, else the sampled x_{k-1}
    z = drafter.confidence_logits(hd, prev_ids)    # [n], pre-sigmoid (the engine applies STS)

``block_ids`` is ``[anchor, mask, ..., mask]`` at absolute positions ``[p, p+B)`` where
``p = cache_len + c``; ``ctx_new`` holds the target taps of positions ``[cache_len, p)``.
Slot convention (the most likely bug, docs/method.md §2.2): DeepSpec slot j predicts ``p + j + 1`` (rows
0..B-1), z-lab DFlash slot i >= 1 predicts ``p + i`` (rows 1..B-1). `draft_hidden` applies it.

Training may pass ``vocab`` [S] (a draft shortlist, `engine.train.shortlist`) to `draft_logits`:
the same logits, restricted to those columns [n, S], computed without the vocabulary-wide products.
Serving forms rows with `draft_rows` (and their base with `draft_base`): over the whole vocabulary,
or, for a drafter with a draft vocabulary (``Drafter.shortlist``, docs/method.md §3.6), over those
columns only, scattered into a [n, V] row that is -inf elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from engine.models.drafter_config import DrafterConfig
from engine.models.drafter_layers import DrafterLayer, merge_heads
from engine.models.gemma_drafter_layers import GemmaDrafterLayer

ArrayFn = Callable[[mx.array], mx.array]
QUANTIZE_MODES = (None, "bf16", "8bit", "4bit")


class MarkovHead(nn.Module):
    """Sequential bias B(x_{k-1}, .) added to the base logits (docs/method.md §3.2)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        v, r, d = cfg.vocab_size, cfg.markov_rank, cfg.hidden_size
        self.kind = cfg.markov_head_type
        self.markov_w1 = nn.Embedding(v, r)  # weight [V, r]
        self.markov_w2 = nn.Linear(r, v, bias=False)  # weight [V, r]
        if self.kind == "gated":
            self.gate_proj = nn.Linear(d + r, r)  # input [h ; W1[prev]]
        elif self.kind == "rnn":
            self.joint_proj = nn.Linear(2 * r + d, 3 * r)  # input [s ; W1[prev] ; h] -> gate, cand, out
        # Serving's draft vocabulary and W2's rows for it [S, r], gathered once (plain attributes).
        object.__setattr__(self, "_columns", None)
        object.__setattr__(self, "_column_rows", None)

    def set_columns(self, vocab: mx.array | None) -> None:
        """Remember serving's draft vocabulary ``vocab`` [S]: `step` with that very array reuses
        W2's rows for it instead of gathering them per draft row."""
        object.__setattr__(self, "_columns", vocab)
        object.__setattr__(self, "_column_rows", None)

    def step(self, prev_ids: mx.array, h: mx.array | None, state: mx.array | None,
             vocab: mx.array | None = None) -> tuple[mx.array, mx.array | None]:
        """Bias [n, V] for previous tokens ``prev_ids`` [n]; ``h`` [n, d] and ``state`` [n, r] if needed.

        ``vocab`` [S] restricts the bias to those columns: [n, S].
        """
        emb = self.markov_w1(prev_ids)  # [n, r]
        if self.kind == "vanilla":
            return self._out(emb, vocab), state
        if h is None:
            raise ValueError(f"the {self.kind} Markov head needs the backbone hidden state h")
        h = h.astype(emb.dtype)
        if self.kind == "gated":
            gate = mx.sigmoid(self.gate_proj(mx.concatenate([h, emb], axis=-1)))
            return self._out(gate * emb, vocab), state
        if state is None:
            state = mx.zeros(emb.shape, dtype=emb.dtype)
        gate, cand, out = mx.split(self.joint_proj(mx.concatenate([state, emb, h], axis=-1)), 3, axis=-1)
        gate = mx.sigmoid(gate)
        new_state = gate * state + (1.0 - gate) * mx.tanh(cand)
        return self._out(mx.tanh(out), vocab), new_state

    def _out(self, x: mx.array, vocab: mx.array | None) -> mx.array:
        # W2 x: [n, r] -> [n, V], or [n, S] for the columns ``vocab`` [S] (rows of W2 [V, r] only).
        if vocab is None:
            return self.markov_w2(x)
        if vocab is self._columns:  # serving's shortlist: W2's rows [S, r], gathered (dequantized) once
            if self._column_rows is None:
                rows = _linear_rows(self.markov_w2, vocab)
                if rows is not None:
                    mx.eval(rows)
                object.__setattr__(self, "_column_rows", (rows,))
            rows = self._column_rows[0]
            if rows is not None:
                return x @ rows.astype(x.dtype).T
        if not isinstance(self.markov_w2, nn.Linear):  # quantized: no row gather on packed weights
            return mx.take(self.markov_w2(x), vocab, axis=-1)
        return x @ self.markov_w2.weight[vocab].T


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(w . [h_k ; W1[x_{k-1}]] + b); this module returns the logit (docs/method.md §3.3)."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.proj = nn.Linear(in_dim, 1)

    def __call__(self, features: mx.array) -> mx.array:
        return self.proj(features).squeeze(-1)


class Drafter(nn.Module):
    """DSpark (DeepSpec) or DFlash (z-lab) drafter; parameter names match the checkpoints 1:1."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        d = cfg.hidden_size
        self.fc = nn.Linear(cfg.num_taps * d, d, bias=False)
        self.hidden_norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        layer_class = GemmaDrafterLayer if cfg.is_gemma else DrafterLayer
        self.layers = [layer_class(cfg) for _ in range(cfg.num_hidden_layers)]
        self.norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        if cfg.owns_embeddings:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
            if not cfg.tie_word_embeddings:
                self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.markov_rank > 0:
            self.markov_head = MarkovHead(cfg)
        if cfg.enable_confidence_head:
            extra = cfg.markov_rank if cfg.confidence_head_with_markov else 0
            self.confidence_head = ConfidenceHead(d + extra)
        # Plain attributes (not Module children): no parameters, never saved or quantized.
        object.__setattr__(self, "config", cfg)
        object.__setattr__(self, "_rope", initialize_rope(
            cfg.attn_head_dim, base=cfg.rope_theta, traditional=False, scaling_config=cfg.rope_scaling,
            max_position_embeddings=cfg.max_position_embeddings))
        object.__setattr__(self, "_target_embed", None)
        object.__setattr__(self, "_target_lm_head", None)
        object.__setattr__(self, "_target_head_rows", None)
        object.__setattr__(self, "shortlist", None)  # [S] int32 sorted draft vocabulary, or None
        object.__setattr__(self, "_shortlist_rows", None)  # (dtype, head rows [S, d]) cached for serving

    def set_shortlist(self, ids: mx.array | None) -> Drafter:
        """Draft only from the token ids ``ids`` [S] (sorted, distinct, in [0, V)); None: the whole vocabulary.

        The caller (the loader) validates them. The head's and the Markov head's rows for them are
        gathered once, at first use, not per draft row.
        """
        object.__setattr__(self, "shortlist", None if ids is None else ids.astype(mx.int32))
        object.__setattr__(self, "_shortlist_rows", None)
        if self.has_markov:
            self.markov_head.set_columns(self.shortlist)
        return self

    # ------------------------------------------------------------ target binding

    def bind_target(self, embed_fn: ArrayFn, lm_head_fn: ArrayFn, head_rows_fn: ArrayFn | None = None) -> Drafter:
        """Use the target's embedding (ids -> [.., d]) and lm_head ([.., d] -> [.., V]).

        Required for z-lab DFlash (and legacy DSpark checkpoints without their own copies). Pass
        the target's ``embed_tokens`` module and its ``lm_head`` (``embed_tokens.as_linear`` when
        tied). Stored as plain attributes, so they never show up in `parameters()`.
        ``head_rows_fn`` (ids [S] -> lm_head weight rows [S, d]) lets `base_logits` compute a
        column subset without the vocabulary-wide product; without it the subset is taken from
        the full logits (same values, no saving).
        """
        object.__setattr__(self, "_target_embed", embed_fn)
        object.__setattr__(self, "_target_lm_head", lm_head_fn)
        object.__setattr__(self, "_target_head_rows", head_rows_fn)
        object.__setattr__(self, "_shortlist_rows", None)  # the head changed: gather its rows anew
        return self

    def bind_target_model(self, model: nn.Module) -> Drafter:
        """`bind_target` from an mlx-lm causal LM (``model.model.embed_tokens`` / ``model.lm_head``), or
        an mlx-vlm language model: Gemma's then come with the target's embedding scale and logit soft-cap."""
        inner = getattr(model, "model", model)
        embed = getattr(inner, "embed_tokens", None)
        if embed is None:
            raise AttributeError(f"cannot find embed_tokens on {type(model).__name__}")
        from_hidden = getattr(model, "logits_from_hidden", None)  # mlx-vlm: the target's own head
        if from_hidden is not None:
            scale = getattr(inner, "embed_scale", 1.0)
            # No row gather: a soft-capped column subset is not the subset of the raw product.
            return self.bind_target(lambda ids: embed(ids) * scale, from_hidden, None)
        lm_head = getattr(model, "lm_head", None)  # absent when the target ties its embeddings
        if lm_head is None:  # tied: the head's rows are the embedding's rows
            return self.bind_target(embed, embed.as_linear, embed)
        rows = _weight_rows(lm_head)
        return self.bind_target(embed, lm_head, rows)

    @property
    def needs_target_binding(self) -> bool:
        """True when the checkpoint has no embedding / lm_head of its own."""
        return not self.config.owns_embeddings

    # ------------------------------------------------------------ backbone

    @property
    def compute_dtype(self) -> mx.Dtype:
        """Activation dtype: follows the (never quantized) final norm, fp32 unless cast to bf16."""
        return self.norm.weight.dtype

    def make_cache(self) -> list[KVCache]:
        """Fresh per-layer draft context cache (context K/V only, post-k_norm, post-RoPE)."""
        return [KVCache() for _ in self.layers]

    @staticmethod
    def context_length(cache: list[KVCache]) -> int:
        """Number of context positions already in ``cache``."""
        return cache[0].offset

    def embed(self, ids: mx.array) -> mx.array:
        """Token embeddings [.., d] in the compute dtype (own copy or the bound target's).

        Gemma-4 scales them by sqrt(d), in the compute dtype, as its scaled embedding does.
        """
        if self.config.owns_embeddings:
            out = self.embed_tokens(ids)
        else:
            out = self._bound("_target_embed")(ids)
        out = out.astype(self.compute_dtype)
        if self.config.is_gemma:
            out = out * mx.array(self.config.hidden_size**0.5, dtype=out.dtype)
        return out

    def project_context(self, taps: mx.array) -> mx.array:
        """H_ctx = hidden_norm(fc(taps)): [1, c, m*d] -> [1, c, d] (spec Eq. 2)."""
        if taps.shape[-1] != self.config.num_taps * self.config.hidden_size:
            raise ValueError(f"context taps have width {taps.shape[-1]}, expected "
                             f"{self.config.num_taps} x {self.config.hidden_size}")
        return self.hidden_norm(self.fc(taps.astype(self.compute_dtype)))

    def append_context(self, ctx_new: mx.array, cache: list[KVCache]) -> None:
        """Project ``ctx_new`` [1, c, m*d] and append its K/V to every layer's cache (c may be 0)."""
        if ctx_new is None or ctx_new.shape[1] == 0:
            return
        ctx_h = self.project_context(ctx_new)  # [1, c, d]
        for layer, layer_cache in zip(self.layers, cache):
            layer.append_context(ctx_h, layer_cache, self._rope)

    def backbone(self, ctx_new: mx.array | None, block_ids: mx.array, cache: list[KVCache]) -> mx.array:
        """Append ``ctx_new`` to the context cache, then run the block; returns final-normed h [1, B, d].

        ``ctx_new`` [1, c, m*d] covers positions [cache_len, cache_len + c); ``block_ids`` [1, B] =
        [anchor, mask, ...] sits at [p, p + B) with p = cache_len + c. Block K/V are never cached.
        """
        self._check_block(block_ids)
        self.append_context(ctx_new, cache)
        offset = self.context_length(cache)  # p: the anchor's absolute position
        x = self.embed(block_ids)  # [1, B, d]
        for layer, layer_cache in zip(self.layers, cache):
            x = layer(x, layer_cache, self._rope, offset)
        return self.norm(x)

    __call__ = backbone

    def draft_hidden(self, h: mx.array) -> mx.array:
        """Rows of h [.., B, d] that hold drafts: [.., max_drafts, d]; row k-1 drafts position p + k."""
        return h[..., self.config.draft_slot_offset:, :]

    def reference_forward(self, ctx_all: mx.array, block_ids: mx.array) -> mx.array:
        """No-cache reference: recompute all context K/V with explicit softmax attention -> h [1, B, d].

        ``ctx_all`` [1, P, m*d] holds the taps for positions [0, P); the block sits at [P, P + B).
        Independent of `KVCache` and fused SDPA, so tests can check the incremental path against it.
        """
        self._check_block(block_ids)
        ctx_h = self.project_context(ctx_all)  # [1, P, d]
        x = self.embed(block_ids)
        for layer in self.layers:
            x = _reference_layer(layer, x, ctx_h, self._rope)
        return self.norm(x)

    # ------------------------------------------------------------ heads

    def base_logits(self, h: mx.array, vocab: mx.array | None = None) -> mx.array:
        """U = lm_head(h), soft-capped when the config says so: [.., d] -> [.., V] float32.

        The soft cap (Gemma-4: ``c * tanh(U / c)``) belongs to U, so `draft_logits` adds the
        Markov bias after it, as DeepSpec does (``compute_logits``, then the Markov head); every
        caller of U gets it from here. Logits are always sampled in fp32.
        ``vocab`` [S] (training's draft shortlist): only those columns, [.., S], from the head's
        rows [S, d] when they can be read directly (the vocabulary-wide product is most of a
        training step). The cap is elementwise, so it commutes with taking columns.
        """
        cap = self.config.final_logit_softcapping
        logits = self._head_logits(h, vocab)
        return logits if cap is None else cap * mx.tanh(logits / cap)

    def _head_logits(self, h: mx.array, vocab: mx.array | None) -> mx.array:
        """lm_head(h) [.., V] (or its columns ``vocab``: [.., S]) in float32, before any soft cap."""
        if vocab is not None:
            rows = self._shortlist_head_rows(h.dtype) if vocab is self.shortlist else self._head_rows(vocab)
            if rows is None:
                return mx.take(self._head_logits(h, None), vocab, axis=-1)
            return (h @ rows.astype(h.dtype).T).astype(mx.float32)
        if not self.config.owns_embeddings:
            out = self._bound("_target_lm_head")(h)
        elif self.config.tie_word_embeddings:
            out = self.embed_tokens.as_linear(h)
        else:
            out = self.lm_head(h)
        return out.astype(mx.float32)

    def _shortlist_head_rows(self, dtype: mx.Dtype) -> mx.array | None:
        """The head's rows [S, d] for ``self.shortlist`` in ``dtype``, gathered once (a per-row gather
        of S x d weights would cost as much as the product it saves); None when unreadable."""
        cached = self._shortlist_rows
        if cached is None or cached[0] != dtype:
            rows = self._head_rows(self.shortlist)
            if rows is None:  # a quantized linear head: its rows, dequantized once
                rows = _packed_rows(self._head_module(), self.shortlist)
            rows = None if rows is None else rows.astype(dtype)
            if rows is not None:
                mx.eval(rows)
            cached = (dtype, rows)
            object.__setattr__(self, "_shortlist_rows", cached)
        return cached[1]

    def _head_module(self):
        """The output head as a module (own lm_head, or the bound target's), or None when it is tied
        or only a function."""
        if not self.config.owns_embeddings:
            return self._target_lm_head
        return None if self.config.tie_word_embeddings else self.lm_head

    def _head_rows(self, vocab: mx.array) -> mx.array | None:
        """The output head's weight rows [S, d] for token ids ``vocab`` [S]; None when unreadable."""
        if not self.config.owns_embeddings:
            self._bound("_target_lm_head")
            fn = self._target_head_rows
            return fn(vocab) if fn is not None else None
        if self.config.tie_word_embeddings:
            return self.embed_tokens(vocab)  # an embedding lookup is a row gather (dequantized if packed)
        rows = _weight_rows(self.lm_head)
        return rows(vocab) if rows is not None else None

    @property
    def has_markov(self) -> bool:
        """True when the checkpoint has a Markov head (markov_rank > 0)."""
        return self.config.markov_rank > 0

    @property
    def has_confidence(self) -> bool:
        """True when the checkpoint has a confidence head."""
        return self.config.enable_confidence_head

    def markov_init_state(self, n: int = 1) -> mx.array | None:
        """Initial recurrent state [n, r] for the rnn head; None for stateless heads."""
        if not self.has_markov or self.config.markov_head_type != "rnn":
            return None
        return mx.zeros((n, self.config.markov_rank), dtype=self.compute_dtype)

    def markov_step(self, prev_ids: mx.array, h: mx.array | None, state: mx.array | None,
                    vocab: mx.array | None = None) -> tuple[mx.array, mx.array | None]:
        """One sequential step of any head type: bias [n, V] float32 and the next state.

        ``prev_ids`` [n] is the anchor for draft 1 and the *sampled* previous draft afterwards;
        ``h`` [n, d] is that draft's backbone row (needed by gated / rnn heads). ``vocab`` [S]
        restricts the bias to those columns: [n, S].
        """
        if not self.has_markov:
            raise ValueError("this drafter has no Markov head (markov_rank = 0)")
        bias, state = self.markov_head.step(prev_ids, h, state, vocab)
        return bias.astype(mx.float32), state

    def markov_bias(self, prev_ids: mx.array, h: mx.array | None = None,
                    vocab: mx.array | None = None) -> mx.array:
        """Stateless Markov bias W2 . W1[prev]: prev_ids [n] -> [n, V] float32 (vanilla / gated).

        ``h`` [n, d] is required by gated heads. Callers that form draft logits use `draft_logits`,
        which always passes it. ``vocab`` [S] restricts the bias to those columns: [n, S].
        """
        if self.has_markov and self.config.markov_head_type == "rnn":
            raise ValueError("the rnn Markov head is stateful: use markov_init_state / markov_step")
        return self.markov_step(prev_ids, h, None, vocab)[0]

    def confidence_logits(self, h: mx.array, prev_ids: mx.array) -> mx.array:
        """Pre-sigmoid confidence z_k from h [n, d] and x_{k-1} ids [n] -> [n] float32."""
        if not self.has_confidence:
            raise ValueError("this drafter has no confidence head")
        features = h.astype(self.compute_dtype)
        if self.config.confidence_head_with_markov:
            prev = self.markov_head.markov_w1(prev_ids).astype(features.dtype)  # [n, r]
            features = mx.concatenate([features, prev], axis=-1)
        return self.confidence_head(features).astype(mx.float32)

    # ------------------------------------------------------------ helpers

    def _bound(self, name: str) -> ArrayFn:
        fn = getattr(self, name)
        if fn is None:
            raise RuntimeError("this drafter uses the target's embedding and lm_head: call "
                               "bind_target(...) or bind_target_model(target) first")
        return fn

    def _check_block(self, block_ids: mx.array) -> None:
        if block_ids.ndim != 2 or block_ids.shape[1] != self.config.block_size:
            raise ValueError(f"block_ids must be [1, {self.config.block_size}], got {tuple(block_ids.shape)}")


def draft_logits(drafter: Drafter, h_rows: mx.array, prev_ids: mx.array,
                 base: mx.array | None = None, vocab: mx.array | None = None) -> mx.array:
    """Draft logits U + B(prev, h) of draft rows: h_rows [n, d], prev_ids [n] -> [n, V] float32.

    The single place a draft distribution is formed. Serving (`SpecDecoder._draft`), the cost
    timer and the trainer's losses all call it, so no caller can hand a head fewer inputs than
    training gave it: gated heads need ``h``, which an ad-hoc ``base + markov_bias(prev)``
    dropped. ``prev_ids[i]`` is the token before the one row i drafts: the anchor for draft 1,
    then the *sampled* previous draft when serving, the true previous token when training.
    ``base`` [n, V] is ``drafter.base_logits(h_rows)`` when the caller already has it (serving
    projects every row it will verify in one lm_head product); None computes it here. Either
    way U is `Drafter.base_logits`, soft cap included (Gemma-4), so the bias lands after the cap.
    ``vocab`` [S] (training only: the draft shortlist of the batch) gives the same logits at
    those columns only, [n, S] (``base``, if passed, must then be [n, S] too). Serving passes
    none: its drafts are sampled from the whole vocabulary.
    """
    if vocab is not None:  # training's shortlist; serving's calls below stay exactly as they were
        logits = drafter.base_logits(h_rows, vocab) if base is None else base  # [n, S]
        return logits + drafter.markov_bias(prev_ids, h_rows, vocab) if drafter.has_markov else logits
    logits = drafter.base_logits(h_rows) if base is None else base  # [n, V] float32
    if drafter.has_markov:
        logits = logits + drafter.markov_bias(prev_ids, h_rows)  # [n, V]
    return logits


def draft_base(drafter, h_rows: mx.array) -> mx.array:
    """Serving's base logits of draft rows h_rows [n, d]: [n, V], or [n, S] over the drafter's
    shortlist when it has one (the vocabulary-wide head product is then never formed)."""
    vocab = getattr(drafter, "shortlist", None)  # duck-typed test drafters have none
    return drafter.base_logits(h_rows) if vocab is None else drafter.base_logits(h_rows, vocab)


def draft_rows(drafter, h_rows: mx.array, prev_ids: mx.array, base: mx.array | None = None) -> mx.array:
    """Serving's draft logits [n, V] (`draft_logits`), over the drafter's shortlist when it has one.

    ``base`` is `draft_base` of the same rows, or None. Without a shortlist this is exactly
    `draft_logits` over the whole vocabulary. With one (S sorted ids) the logits are formed over
    S only, [n, S], and placed in a row that is -inf at every other token. Lossless by
    construction: the accept rule only needs q to be the distribution the draft was sampled from,
    and everything downstream (processors, temperature and truncation, the draw, log q, the ratio
    p/q and the residual max(p - q, 0)) sees this row, so q is the softmax over S and exactly 0
    elsewhere: a token outside S is never drafted, and the target's residual supplies it.
    """
    vocab = getattr(drafter, "shortlist", None)
    if vocab is None:
        return draft_logits(drafter, h_rows, prev_ids, base)
    logits = draft_logits(drafter, h_rows, prev_ids, base, vocab=vocab)  # [n, S]
    return scatter_columns(logits, vocab, drafter.config.vocab_size)


def scatter_columns(logits: mx.array, vocab: mx.array, size: int) -> mx.array:
    """Logits [n, S] at columns ``vocab`` [S] of a [n, size] row that is -inf elsewhere.

    Built as a -inf row whose S entries are then *set* (not added: -inf + x would stay -inf).
    """
    n = logits.shape[0]
    floor = mx.full((n, size), float("-inf"), dtype=mx.float32)  # [n, V]
    cols = mx.broadcast_to(vocab[None], (n, vocab.shape[0]))  # [n, S]
    return mx.put_along_axis(floor, cols, logits.astype(mx.float32), axis=-1)


def _weight_rows(head) -> ArrayFn | None:
    """ids [S] -> rows [S, d] of a plain linear head's weight [V, d]; None for anything else
    (a quantized head packs its rows: callers then take the columns from the full product)."""
    if isinstance(head, nn.Linear):  # nn.QuantizedLinear is not a subclass
        return lambda ids: head.weight[ids]
    return None


def _packed_rows(head, ids: mx.array) -> mx.array | None:
    """Rows [S, d] of an affine-quantized linear head's weight for ``ids`` [S], dequantized (the same
    values its product uses); None for anything else."""
    if not isinstance(head, nn.QuantizedLinear) or getattr(head, "mode", "affine") != "affine":
        return None
    return mx.dequantize(head.weight[ids], head.scales[ids], head.biases[ids], head.group_size, head.bits)


def _linear_rows(head, ids: mx.array) -> mx.array | None:
    """Weight rows [S, r] of a plain or affine-quantized linear map for output ids [S]; None otherwise."""
    return head.weight[ids] if isinstance(head, nn.Linear) else _packed_rows(head, ids)


def _reference_layer(layer: DrafterLayer, x: mx.array, ctx_h: mx.array, rope: nn.Module) -> mx.array:
    """One layer as a single sequence [context ; block] at positions [0, P + B), queries from the block.

    Only the attention is recomputed independently; what follows it is the layer's own `combine`.
    """
    attn = layer.self_attn
    xn = layer.input_layernorm(x)  # the block stream only; context rows are not re-normed
    num_ctx = ctx_h.shape[1]
    keys, values = attn.project_kv(mx.concatenate([ctx_h, xn], axis=1), rope, 0)  # [1, Hkv, P+B, hd]
    queries = attn.project_q(xn, rope, num_ctx)  # [1, H, B, hd]
    rep = attn.n_heads // attn.n_kv_heads
    keys, values = mx.repeat(keys, rep, axis=1), mx.repeat(values, rep, axis=1)
    scores = (queries * attn.scale) @ keys.transpose(0, 1, 3, 2)  # [1, H, B, P+B]
    out = mx.softmax(scores, axis=-1, precise=True) @ values
    return layer.combine(x, attn.o_proj(merge_heads(out)))


# ---------------------------------------------------------------- quantization


def _group_size(in_dim: int) -> int | None:
    for size in (64, 32):
        if in_dim % size == 0:
            return size
    return None


def quantize_drafter(drafter: Drafter, mode: str | None) -> Drafter:
    """Quantize in place: None (fp32), "bf16" (cast), "8bit" / "4bit" (affine, Linear/Embedding).

    Lossless by construction (q changes, the verifier still uses the true q). Layers whose input
    width does not divide the group size stay fp32, and the confidence head always does: its
    logits steer the scheduler and it is tiny.
    """
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"unknown drafter quantization {mode!r}; choose one of {QUANTIZE_MODES}")
    if mode is None:
        return drafter
    if mode == "bf16":
        drafter.set_dtype(mx.bfloat16)
        return drafter
    bits = 8 if mode == "8bit" else 4

    def predicate(path: str, module: nn.Module) -> bool | dict:
        if path.startswith("confidence_head") or not isinstance(module, (nn.Linear, nn.Embedding)):
            return False
        size = _group_size(module.weight.shape[-1])
        return {"group_size": size, "bits": bits} if size else False

    nn.quantize(drafter, class_predicate=predicate)
    return drafter
