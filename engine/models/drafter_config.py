"""Drafter configuration: one normalised `DrafterConfig` for every checkpoint layout we accept.

Layouts (docs/method.md §4.1):
  * ``deepspec``: DeepSpec `Qwen3DSparkModel` (top-level DSpark keys, own frozen embedding and
    lm_head copies). Block slot j (0-based) predicts the token at ``p + j + 1``: B slots, B drafts.
    The legacy SpecForge `DSparkDraftModel` (+ nested ``dflash_config``) is read into this layout
    too; whether it carries its own embedding is decided by its weights (see ``owns_embeddings``).
  * ``dflash``: z-lab `DFlashDraftModel` (nested ``dflash_config``, no embedding / lm_head: the
    target's are bound at runtime). Slot i >= 1 predicts ``p + i``; slot 0's output is unused,
    so B slots give B - 1 drafts.
  * Families: the backbone is Qwen3-style (``family`` "qwen3") for all of the above, or Gemma-4
    (``family`` "gemma4") for DeepSpec `Gemma4DSparkModel`, which has the ``deepspec`` slot
    convention and its own embedding / lm_head copies; its keys are read by
    `engine.models.drafter_config_gemma` (docs/method.md §4.1).

Nothing here imports MLX: the config is plain data, shared by the loader, the engine and the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.models.drafter_config_gemma import (
    GEMMA4_ARCH,
    GEMMA4_FAMILY,
    QWEN3_FAMILY,
    GemmaVariantError,
    gemma_fields,
    gemma_raw,
    gemma_rope_source,
)

DEEPSPEC_ARCH = "Qwen3DSparkModel"
DFLASH_ARCH = "DFlashDraftModel"
LEGACY_DSPARK_ARCH = "DSparkDraftModel"
SUPPORTED_ARCHITECTURES = (DEEPSPEC_ARCH, GEMMA4_ARCH, DFLASH_ARCH, LEGACY_DSPARK_ARCH)
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")  # every type DeepSpec checkpoints name
# The rnn head's bias carries a recurrent state from draft to draft; neither the trainer nor the
# round threads that state, so such a drafter is refused when its config is read, not mid-request.
SERVABLE_MARKOV_HEAD_TYPES = ("vanilla", "gated")
RNN_UNSUPPORTED = ("the rnn Markov head (markov_head_type 'rnn') is not supported: its stateful bias is not "
                   "threaded through draft rounds or training; use a vanilla or gated drafter")

# Geometry keys every config must carry; the rest have safe defaults.
_REQUIRED_GEOMETRY = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "vocab_size")


class DrafterConfigError(ValueError):
    """The drafter config.json is unsupported or inconsistent; the message says why."""


@dataclass(frozen=True)
class DrafterConfig:
    """Normalised drafter configuration (shapes: d = hidden_size, m = num_taps, B = block_size)."""

    layout: str  # "deepspec" | "dflash": decides the slot -> position convention
    architecture: str  # the checkpoint's own class name, e.g. "Qwen3DSparkModel"
    block_size: int  # B: slots per drafter call (anchor + B - 1 masks)
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # target decoder layers tapped, in concat order (-1 = embeddings)
    num_target_layers: int
    markov_rank: int  # r; 0 = no Markov head
    markov_head_type: str  # "vanilla" | "gated" | "rnn"
    enable_confidence_head: bool
    confidence_head_with_markov: bool
    sts_temperatures: tuple[float, ...] | None  # per-draft-position STS temperatures, None = all 1
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    owns_embeddings: bool = True  # checkpoint stores embed_tokens/lm_head (else bind the target's)
    # Backbone family: "qwen3" (every layout above) or "gemma4" (DeepSpec Gemma4DSparkModel).
    family: str = QWEN3_FAMILY
    # Gemma-4 only (None / defaults for qwen3): see engine/models/drafter_config_gemma.py.
    global_head_dim: int | None = None  # the attention head dim of the drafter's (full-attention) layers
    num_global_key_value_heads: int | None = None  # KV heads when attention_k_eq_v
    attention_k_eq_v: bool = False  # no v_proj: V is K's projection (before the norms)
    final_logit_softcapping: float | None = None  # base logits -> c * tanh(logits / c)
    hidden_activation: str = "silu"  # the MLP's gate activation

    def __post_init__(self) -> None:
        # Callers may pass lists (e.g. from JSON); keep the frozen value a tuple so equality holds.
        object.__setattr__(self, "target_layer_ids", tuple(int(t) for t in self.target_layer_ids))
        if self.sts_temperatures is not None:
            object.__setattr__(self, "sts_temperatures", tuple(float(t) for t in self.sts_temperatures))

    @property
    def is_gemma(self) -> bool:
        """True for the Gemma-4 backbone (sandwich norms, K = V, soft-capped logits, ...)."""
        return self.family == GEMMA4_FAMILY

    @property
    def attn_head_dim(self) -> int:
        """Per-head width of the drafter's attention: ``global_head_dim`` for Gemma-4, else head_dim."""
        return self.global_head_dim if self.is_gemma else self.head_dim

    @property
    def attn_kv_heads(self) -> int:
        """KV heads of the drafter's attention (Gemma-4 with K = V: ``num_global_key_value_heads``)."""
        if self.is_gemma and self.attention_k_eq_v:
            return self.num_global_key_value_heads
        return self.num_key_value_heads

    @property
    def num_taps(self) -> int:
        """m: number of tapped target layers; the context feature width is m * hidden_size."""
        return len(self.target_layer_ids)

    @property
    def draft_slot_offset(self) -> int:
        """First block slot holding a draft: slot ``offset + k - 1`` predicts position ``p + k``.

        0 for DeepSpec (slot j -> p + j + 1), 1 for z-lab DFlash (slot i -> p + i).
        """
        return 0 if self.layout == "deepspec" else 1

    @property
    def max_drafts(self) -> int:
        """Most drafts one drafter call can propose: B (DeepSpec) or B - 1 (z-lab DFlash)."""
        return self.block_size - self.draft_slot_offset


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps: ``num_draft_layers`` ids spread evenly over [1, num_target_layers - 3]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def normalize_drafter_config(raw: dict, *, num_target_layers: int | None = None) -> DrafterConfig:
    """Parse a drafter ``config.json`` dict into a `DrafterConfig`, or raise `DrafterConfigError`.

    Args:
        raw: the parsed config.json.
        num_target_layers: fallback when the config does not record the target's depth.
    """
    arch = _architecture(raw)
    nested = raw.get("dflash_config") or {}
    if not isinstance(nested, dict):
        raise DrafterConfigError("'dflash_config' must be a JSON object")
    layout = "dflash" if arch == DFLASH_ARCH else "deepspec"
    family = _family_fields(arch, raw)
    geom = _geometry(raw, is_gemma=bool(family))
    n_target = _first(raw, nested, "num_target_layers", default=num_target_layers)
    if n_target is None:
        raise DrafterConfigError("config has no 'num_target_layers'; cannot validate target_layer_ids")
    taps = _first(raw, nested, "target_layer_ids")
    if taps is None:
        taps = build_target_layer_ids(int(n_target), geom["num_hidden_layers"])
    heads = _heads(raw, nested)
    cfg = DrafterConfig(
        layout=layout,
        architecture=arch,
        block_size=int(_require(raw, nested, "block_size")),
        mask_token_id=int(_require(raw, nested, "mask_token_id")),
        target_layer_ids=tuple(int(t) for t in taps),
        num_target_layers=int(n_target),
        sts_temperatures=_sts(raw),
        owns_embeddings=arch in (DEEPSPEC_ARCH, GEMMA4_ARCH),
        **heads,
        **geom,
        **family,
    )
    _validate(cfg, raw)
    return cfg


def drafter_config_to_raw(cfg: DrafterConfig, extra: dict | None = None) -> dict:
    """The config.json dict for ``cfg`` in its own layout; `normalize_drafter_config` inverts it.

    ``extra`` (e.g. the target's config keys, ``num_anchors``) is merged underneath our keys.
    """
    raw: dict[str, Any] = dict(extra or {})
    # Our rope keys are authoritative; a copied target rope_parameters could contradict them.
    raw.pop("rope_parameters", None)
    raw.pop("dflash_config", None)
    raw.update(_geometry_raw(cfg))
    if cfg.is_gemma:
        raw.update(gemma_raw(cfg))
    raw.update(_heads_raw(cfg))
    if cfg.sts_temperatures is not None:
        raw["sts_temperatures"] = list(cfg.sts_temperatures)
    taps = list(cfg.target_layer_ids)
    if cfg.layout == "dflash" or cfg.architecture == LEGACY_DSPARK_ARCH:
        raw.update(architectures=[cfg.architecture], block_size=cfg.block_size,
                   num_target_layers=cfg.num_target_layers,
                   dflash_config={"mask_token_id": cfg.mask_token_id, "target_layer_ids": taps})
    else:
        raw.setdefault("num_anchors", 512)  # DeepSpec's own loader requires the key
        raw.update(architectures=[cfg.architecture], block_size=cfg.block_size,
                   mask_token_id=cfg.mask_token_id, target_layer_ids=taps,
                   num_target_layers=cfg.num_target_layers,
                   layer_types=["full_attention"] * cfg.num_hidden_layers)
    return raw


# ---------------------------------------------------------------- parsing helpers


def _architecture(raw: dict) -> str:
    archs = raw.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    model_type = str(raw.get("model_type", ""))
    if arch not in SUPPORTED_ARCHITECTURES and model_type.startswith("gemma"):
        raise DrafterConfigError(
            f"Gemma-family drafter {arch or model_type!r} is not supported; the only Gemma drafter "
            f"implemented is DeepSpec's {GEMMA4_ARCH}. Supported architectures: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    if "speculators_config" in raw:
        raise DrafterConfigError("vLLM 'speculators' drafter packaging is not supported; use a DeepSpec "
                                 "(Qwen3DSparkModel) or z-lab (DFlashDraftModel) checkpoint")
    if arch in SUPPORTED_ARCHITECTURES:
        return arch  # any auto_map is ignored: we run our own implementation, never remote code
    if "auto_map" in raw:
        raise DrafterConfigError(
            f"drafter architecture {arch!r} is not implemented here and its config points to remote "
            "code (auto_map); remote code (auto_map) is never executed. Supported architectures: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    raise DrafterConfigError(f"unknown drafter architecture {arch!r}; supported architectures: "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)}")


def _first(raw: dict, nested: dict, key: str, default: Any = None) -> Any:
    """A key from the nested dflash_config first (newer z-lab / SpecForge), else top level."""
    if nested.get(key) is not None:
        return nested[key]
    return raw.get(key, default) if raw.get(key) is not None else default


def _require(raw: dict, nested: dict, key: str) -> Any:
    value = _first(raw, nested, key)
    if value is None:
        raise DrafterConfigError(f"drafter config is missing required key '{key}' "
                                 "(looked at the top level and in 'dflash_config')")
    return value


def _family_fields(arch: str, raw: dict) -> dict:
    """Gemma-4's own `DrafterConfig` fields ({} for the Qwen3 backbone)."""
    if arch != GEMMA4_ARCH:
        return {}
    try:
        return gemma_fields(raw)
    except GemmaVariantError as exc:
        raise DrafterConfigError(str(exc)) from exc


def _geometry(raw: dict, *, is_gemma: bool = False) -> dict:
    missing = [k for k in _REQUIRED_GEOMETRY if raw.get(k) is None]
    if missing:
        raise DrafterConfigError(f"drafter config is missing required geometry: {', '.join(missing)}")
    heads = int(raw["num_attention_heads"])
    # Gemma-4 nests RoPE per layer type (gemma_fields has checked the full-attention entry exists).
    theta, scaling = _rope(gemma_rope_source(raw) if is_gemma else raw)
    return dict(
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_hidden_layers=int(raw["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        vocab_size=int(raw["vocab_size"]),
        max_position_embeddings=int(raw.get("max_position_embeddings") or 32768),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
    )


def _rope(raw: dict) -> tuple[float, dict | None]:
    """rope_theta (top level or transformers-5 ``rope_parameters``) and a non-default scaling dict."""
    params = raw.get("rope_parameters") or {}
    theta = raw.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise DrafterConfigError("drafter config is missing required geometry: rope_theta "
                                 "(neither top-level nor in rope_parameters)")
    scaling = raw.get("rope_scaling") or params or None
    # DeepSpec copies the target config, so default-type rope dicts may carry inherited noise
    # (partial_rotary_factor, mrope_section) that the stock drafter never applies: ignore them.
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind in ("default", "mrope"):
            scaling = None
        else:
            scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    return float(theta), scaling


def _heads(raw: dict, nested: dict) -> dict:
    rank = int(_first(raw, nested, "markov_rank", default=0))
    kind = str(_first(raw, nested, "markov_head_type", default="vanilla")).lower()
    conf = bool(_first(raw, nested, "enable_confidence_head", default=False))
    with_markov = conf and bool(_first(raw, nested, "confidence_head_with_markov", default=False))
    return dict(markov_rank=rank, markov_head_type=kind, enable_confidence_head=conf,
                confidence_head_with_markov=with_markov)


def _sts(raw: dict) -> tuple[float, ...] | None:
    temps = raw.get("sts_temperatures", raw.get("confidence_temperatures"))
    return None if temps is None else tuple(float(t) for t in temps)


def _validate(cfg: DrafterConfig, raw: dict) -> None:
    _validate_taps(cfg)
    if cfg.block_size < 2 and cfg.layout == "dflash":
        raise DrafterConfigError(
            f"z-lab DFlash needs block_size >= 2 (slot 0 is not a draft), got {cfg.block_size}")
    if cfg.block_size < 1:
        raise DrafterConfigError(f"block_size must be >= 1, got {cfg.block_size}")
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        raise DrafterConfigError(
            f"mask_token_id {cfg.mask_token_id} is outside the vocabulary (size {cfg.vocab_size})")
    if cfg.markov_rank < 0 or cfg.markov_head_type not in MARKOV_HEAD_TYPES:
        raise DrafterConfigError(f"bad Markov head: rank {cfg.markov_rank}, type {cfg.markov_head_type!r} "
                                 f"(types: {', '.join(MARKOV_HEAD_TYPES)})")
    if cfg.markov_rank > 0 and cfg.markov_head_type not in SERVABLE_MARKOV_HEAD_TYPES:
        raise DrafterConfigError(RNN_UNSUPPORTED)
    if cfg.confidence_head_with_markov and cfg.markov_rank == 0:
        raise DrafterConfigError("confidence_head_with_markov is set but markov_rank is 0")
    if cfg.sts_temperatures is not None and len(cfg.sts_temperatures) != cfg.max_drafts:
        raise DrafterConfigError(f"sts_temperatures has {len(cfg.sts_temperatures)} entries; "
                                 f"expected one per draft position ({cfg.max_drafts})")
    if any(t == "sliding_attention" for t in raw.get("layer_types") or []):
        raise DrafterConfigError("sliding-window drafter layers are not supported yet")
    if raw.get("sample_from_anchor") is False and cfg.architecture == LEGACY_DSPARK_ARCH:
        raise DrafterConfigError("legacy DSparkDraftModel with sample_from_anchor=false "
                                 "(DFlash-shifted slots) is not supported yet")


def _validate_taps(cfg: DrafterConfig) -> None:
    last = cfg.num_target_layers - 1
    if not cfg.target_layer_ids:
        raise DrafterConfigError("target_layer_ids is empty")
    for tap in cfg.target_layer_ids:
        if tap == last:
            raise DrafterConfigError(
                f"target_layer_ids contains the final target layer {last}: the drafter was trained on raw "
                "decoder-layer outputs, but Transformers' last hidden_states entry is post-final-norm, so a "
                "tap there is ambiguous (DeepSpec refuses it too). Use an earlier layer.")
        if not -1 <= tap < last:
            raise DrafterConfigError(f"target layer id {tap} is out of range [-1, {last - 1}] "
                                     f"for a {cfg.num_target_layers}-layer target (-1 = embedding output)")


def _geometry_raw(cfg: DrafterConfig) -> dict:
    raw = {k: getattr(cfg, k) for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "rms_norm_eps", "rope_theta", "vocab_size", "max_position_embeddings",
        "tie_word_embeddings", "attention_bias")}
    raw.update(model_type="qwen3", hidden_act=cfg.hidden_activation, rope_scaling=cfg.rope_scaling)
    return raw


def _heads_raw(cfg: DrafterConfig) -> dict:
    return dict(markov_rank=cfg.markov_rank, markov_head_type=cfg.markov_head_type,
                enable_confidence_head=cfg.enable_confidence_head,
                confidence_head_with_markov=cfg.confidence_head_with_markov)
