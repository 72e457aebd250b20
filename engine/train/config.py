"""Training configuration and the drafter geometry derived from the target.

Variants (docs/method.md §8): ``dspark`` = backbone + Markov head + confidence head, trained with
0.1 CE + 0.9 TV + 1.0 confidence BCE; ``dflash`` = backbone only (markov_rank 0, no confidence
head), CE only, as DeepSpec trains its DFlash baseline.

Save layouts (all load unchanged through `engine.loading.drafter.load_drafter`):
  * ``deepspec``: `Qwen3DSparkModel`, frozen embedding / lm_head copies stored in the checkpoint.
  * ``compact``: SpecForge `DSparkDraftModel`, same slots and heads but no embedding copies (the
    engine binds the target's). For SmolLM2 this saves the 49152 x 576 table (57 MB in fp16).
  * ``zlab``: z-lab `DFlashDraftModel` (dflash only). Slot 0 is not a draft, so the saved
    block_size is drafts + 1: a zlab drafter with ``block_size=B`` here drafts B tokens per round,
    the same count as a DSpark drafter with block B (the fair comparison of issue 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.models.drafter_config import (
    DEEPSPEC_ARCH,
    DFLASH_ARCH,
    LEGACY_DSPARK_ARCH,
    RNN_UNSUPPORTED,
    SERVABLE_MARKOV_HEAD_TYPES,
    DrafterConfig,
    build_target_layer_ids,
)

VARIANTS = ("dspark", "dflash")
OBJECTIVES = ("ce_tv", "kd")
LAYOUTS = ("deepspec", "compact", "zlab")
DEFAULT_LAYOUT = {"dspark": "deepspec", "dflash": "zlab"}
# Loss weights (ce, tv, confidence) per variant: DeepSpec's configs (docs/method.md §8).
LOSS_WEIGHTS = {"dspark": (0.1, 0.9, 1.0), "dflash": (1.0, 0.0, 0.0)}


# Named recipes (`dspark train-drafter --recipe`); any flag given explicitly overrides its entry.
# "v1" is the run-3 recipe (docs/drafter-runs/2026-12-03), "v2" issue 18's (engine.train.recipe);
# v2's phase lengths are fractions of --steps (early_frac, final_frac).
RECIPES = {
    "v1": dict(objective="ce_tv", topk=0, batch=2, anchors=64, lr=6e-4, warmup_frac=0.04, weight_decay=0.0,
               beta2=0.999, min_lr_frac=0.0, hidden_weight=0.5, regress_steps=0, early_frac=0.0, final_frac=0.0,
               markov_lr_mult=1.0, instrument_every=0, gate_core_hours=0.0),
    "v2": dict(objective="kd", topk=32, batch=8, anchors=32, lr=2e-3, warmup_frac=0.03, weight_decay=0.05,
               beta2=0.95, min_lr_frac=0.1, hidden_weight=0.5, regress_steps=100, early_frac=0.6, final_frac=0.1,
               markov_lr_mult=0.3, instrument_every=100, gate_core_hours=1.0),
}


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs besides the target and the data."""

    out: Path  # output directory: final drafter, training.json, checkpoints/, features/
    variant: str = "dspark"
    layout: str | None = None  # None: DEFAULT_LAYOUT[variant]
    num_layers: int = 2  # draft decoder layers
    block_size: int = 7  # drafts per block (a zlab checkpoint stores block_size + 1 slots)
    markov_rank: int = 64  # dspark only; 0 for dflash
    markov_head_type: str = "vanilla"  # "vanilla" | "gated" (rnn: not supported, see RNN_UNSUPPORTED)
    taps: tuple[int, ...] | None = None  # tapped target layers; None: spread 3 over the depth
    num_taps: int = 3
    mask_token_id: int | None = None  # None: chosen from the tokenizer's unused specials
    steps: int = 1000
    batch: int = 2  # sequences per step
    anchors: int = 64  # anchor blocks per sequence
    lr: float = 6e-4
    warmup_frac: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    loss_decay: float = 4.0  # w_k = exp(-(k-1)/loss_decay)
    seq_len: int = 512
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    feature_cache: bool = True  # cache target features under out/features (resumable)
    feature_dtype: str = "float32"  # storage dtype of cached features ("float16" halves the disk)
    chunk_sequences: int = 16  # sequences per feature-cache chunk
    features_dir: Path | None = None  # shared feature cache (default out/features)
    topk: int = 0  # target top-k ids and logits kept per row in the cache (distillation needs > 0)
    train_chunks: int | None = None  # train on the first N cache chunks only (None: all)
    grow_every: int = 0  # > 0: start on train_chunks chunks and add one every grow_every steps (order.GrowingOrder)
    eval_max_tokens: int = 64  # generated tokens per held-out prompt in the greedy tau evaluation
    sts_temperature: float = 0.0  # sampling temperature of the STS calibration rounds (0 = greedy)
    save_dtype: str = "float32"
    tap_scale: str = "rms"  # "rms": fc trains on unit-RMS tap features (engine.train.precondition); "none"
    # The v2 recipe (engine.train.recipe; the defaults here keep the run-3 recipe, "ce_tv").
    objective: str = "ce_tv"  # "ce_tv": 0.1 CE + 0.9 TV (+ conf); "kd": distillation + hidden regression
    beta2: float = 0.999
    min_lr_frac: float = 0.0  # the cosine decays to this fraction of lr
    hidden_weight: float = 0.5  # kd: weight of 1 - cos(h_draft, h_target)
    hidden_center: str = "mean"  # kd: "mean" compares states minus the target's mean state; "none"
    regress_steps: int = 0  # kd: first steps on the hidden regression alone
    early_steps: int = 0  # kd: steps (from 0) on draft positions <= early_positions, Markov head frozen
    early_positions: int = 2
    final_steps: int = 0  # kd: last steps add TV and the confidence head (0.5 KD + 0.5 TV + conf)
    markov_lr_mult: float = 1.0  # kd, after the early phase: the Markov head's lr relative to lr
    instrument_every: int = 0  # steps between instrument reports (0 = none)
    gate_core_hours: float = 0.0  # kd: go/no-go after this much CPU time in the early phase (0 = none)
    gate_min_match: float = 0.38  # the gate's teacher-forced held-out greedy match at position 1
    shortlist: int = 0  # kd: KD over the batch's top-k, labels and this many frequent tokens (0 = whole vocabulary)
    extra: dict = field(default_factory=dict)  # free-form notes copied into training.json

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose one of {VARIANTS}")
        if self.resolved_layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; choose one of {LAYOUTS}")
        if self.resolved_layout == "zlab" and self.variant != "dflash":
            raise ValueError("the zlab layout has no Markov or confidence head: use it with --variant dflash")
        if self.markov_head_type == "rnn":
            raise ValueError(RNN_UNSUPPORTED)
        if self.markov_head_type not in SERVABLE_MARKOV_HEAD_TYPES:
            raise ValueError(f"unknown Markov head {self.markov_head_type!r}; choose one of "
                             f"{SERVABLE_MARKOV_HEAD_TYPES}")
        if min(self.steps, self.batch, self.anchors, self.block_size, self.num_layers) < 1:
            raise ValueError("steps, batch, anchors, block_size and num_layers must be >= 1")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of {OBJECTIVES}")
        if self.objective == "kd" and self.topk < 1:
            raise ValueError("the kd objective needs the target's top-k in the feature cache: give --topk (e.g. 32)")
        if self.shortlist < 0:
            raise ValueError("shortlist must be >= 0 (0 = the whole vocabulary)")
        if self.seq_len < self.block_size + 2:
            raise ValueError(f"seq_len {self.seq_len} is too short for block_size {self.block_size}")

    @property
    def resolved_layout(self) -> str:
        """The save layout actually used."""
        return self.layout or DEFAULT_LAYOUT[self.variant]

    @property
    def loss_weights(self) -> tuple[float, float, float]:
        """(ce, tv, confidence) weights of the total loss."""
        return LOSS_WEIGHTS[self.variant]

    @property
    def warmup_steps(self) -> int:
        """Linear warm-up length in steps (at least 1)."""
        return max(1, int(round(self.warmup_frac * self.steps)))


def target_geometry(model) -> dict:
    """Drafter geometry copied from an mlx-lm target (`model.args`): same width and head layout."""
    args = getattr(model, "args", None)
    if args is None:
        raise ValueError(f"{type(model).__name__} has no .args; cannot read the target geometry")
    hidden, heads = int(args.hidden_size), int(args.num_attention_heads)
    return dict(
        hidden_size=hidden,
        intermediate_size=int(args.intermediate_size),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(args, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(args, "head_dim", None) or hidden // heads),
        rms_norm_eps=float(getattr(args, "rms_norm_eps", 1e-6)),
        rope_theta=float(getattr(args, "rope_theta", 10000.0)),
        rope_scaling=getattr(args, "rope_scaling", None),
        vocab_size=int(args.vocab_size),
        max_position_embeddings=int(getattr(args, "max_position_embeddings", None) or 32768),
        tie_word_embeddings=bool(getattr(args, "tie_word_embeddings", False)),
    )


def default_taps(num_target_layers: int, num_taps: int) -> tuple[int, ...]:
    """``num_taps`` layers spread over [1, L-3] (z-lab's rule; never the final layer)."""
    return tuple(build_target_layer_ids(num_target_layers, num_taps))


def default_mask_token_id(tokenizer, vocab_size: int) -> int:
    """An id the target never emits in normal text: its highest special token that is not
    bos / eos / pad / unk (SmolLM2: 16, ``<empty_output>``), else ``vocab_size - 1``."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    specials: set[int] = set()
    for name in ("all_special_ids", "additional_special_tokens_ids"):
        specials.update(getattr(inner, name, None) or [])
    used = {getattr(inner, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")}
    candidates = [i for i in specials if i not in used and 0 <= i < vocab_size]
    return max(candidates) if candidates else vocab_size - 1


def make_drafter_config(cfg: TrainConfig, model, mask_token_id: int) -> DrafterConfig:
    """The `DrafterConfig` of the drafter to train, in its save layout."""
    geom = target_geometry(model)
    num_target = len(model.layers)
    taps = tuple(cfg.taps) if cfg.taps else default_taps(num_target, cfg.num_taps)
    layout = cfg.resolved_layout
    dspark = cfg.variant == "dspark"
    arch = {"deepspec": DEEPSPEC_ARCH, "compact": LEGACY_DSPARK_ARCH, "zlab": DFLASH_ARCH}[layout]
    return DrafterConfig(
        layout="dflash" if layout == "zlab" else "deepspec",
        architecture=arch,
        block_size=cfg.block_size + (1 if layout == "zlab" else 0),
        mask_token_id=int(mask_token_id),
        target_layer_ids=taps,
        num_target_layers=num_target,
        markov_rank=cfg.markov_rank if dspark else 0,
        markov_head_type=cfg.markov_head_type,
        enable_confidence_head=dspark,
        confidence_head_with_markov=dspark and cfg.markov_rank > 0,
        sts_temperatures=None,
        num_hidden_layers=cfg.num_layers,
        owns_embeddings=layout == "deepspec",
        **geom,
    )
