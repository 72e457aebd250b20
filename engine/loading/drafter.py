"""Load and save DSpark / DFlash drafter checkpoints, strictly, plus the published-drafter registry.

Strictness matters: a partly loaded drafter still "works", just with near-zero acceptance, so
every missing, unexpected or mis-shaped tensor is an error that names the tensors (docs/method.md §4.4).
Weights are cast to float32 after loading (CPU); `quantize` then optionally lowers them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from engine.loading import hub
from engine.models.drafter import Drafter, quantize_drafter
from engine.models.drafter_config import (
    LEGACY_DSPARK_ARCH,
    DrafterConfig,
    DrafterConfigError,
    drafter_config_to_raw,
    normalize_drafter_config,
)

log = logging.getLogger(__name__)

_HF_PATTERNS = ["*.json", "*.safetensors", "*.md"]
_INDEX_FILE = "model.safetensors.index.json"
# Non-persistent buffers some exporters still write; they carry no learned state.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_MAX_LISTED = 10
_SAVE_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
# The drafter's draft vocabulary, optional, beside its weights: {"ids": [sorted distinct token ids],
# "size": len(ids), "label_coverage": share of training labels inside} (docs/method.md §3.6).
SHORTLIST_FILE = "shortlist.json"

# Target model stem (lower-case repo name without org / quantization suffix) -> mode -> drafter id.
PUBLISHED_DRAFTERS: dict[str, dict[str, str]] = {
    "qwen3-4b": {"dspark": "deepseek-ai/dspark_qwen3_4b_block7", "dflash": "z-lab/Qwen3-4B-DFlash-b16"},
    "qwen3-8b": {"dspark": "deepseek-ai/dspark_qwen3_8b_block7", "dflash": "z-lab/Qwen3-8B-DFlash-b16"},
    "qwen3-14b": {"dspark": "deepseek-ai/dspark_qwen3_14b_block7"},
    "gemma-4-12b-it": {"dspark": "deepseek-ai/dspark_gemma4_12b_block7"},
}
# Trailing name tokens that only describe packaging or quantization, e.g. "-MLX-4bit", "-bf16".
_PACKAGING_TOKENS = ("mlx", "bf16", "fp16", "fp32", "fp8", "bfloat16", "float16", "dwq", "awq", "gptq",
                     "gguf", "qat", "mxfp4", "nvfp4", "mixed")


class DrafterLoadError(ValueError):
    """A drafter checkpoint cannot be found, read or matched to its config / target."""


# ---------------------------------------------------------------- public API


def load_drafter(path_or_id: str, *, target_vocab_size: int, target_num_layers: int | None = None,
                 target_hidden_size: int | None = None,
                 quantize: str | None = None) -> tuple[Drafter, DrafterConfig]:
    """Load a drafter from a local directory or Hugging Face id, strictly, as float32 on CPU.

    Args:
        path_or_id: directory with config.json + *.safetensors (optionally sharded), or "org/name".
        target_vocab_size: the target's embedding rows (its config ``vocab_size``).
        target_num_layers: the target's decoder layer count; checked against the drafter's taps.
        target_hidden_size: the target's hidden size; the taps must have this width.
        quantize: None, "bf16", "8bit" or "4bit" (see `quantize_drafter`).

    Raises:
        DrafterConfigError: unsupported or inconsistent config.json.
        DrafterLoadError: missing files, key / shape mismatches, or a drafter that does not fit the target.

    z-lab DFlash drafters (``drafter.needs_target_binding``) must then be bound to the target with
    `Drafter.bind_target` / `Drafter.bind_target_model` before use.
    """
    path = resolve_drafter_path(path_or_id)
    cfg = read_drafter_config(path, num_target_layers=target_num_layers)
    weights = read_drafter_weights(path)
    cfg = _adopt_own_embeddings(cfg, weights)
    _check_target_fit(cfg, weights, target_vocab_size, target_num_layers, target_hidden_size)
    drafter = Drafter(cfg)
    check_weight_keys(drafter, weights)
    drafter.load_weights([(k, v.astype(mx.float32)) for k, v in weights.items()], strict=True)
    mx.eval(drafter.parameters())
    quantize_drafter(drafter, quantize)
    drafter.set_shortlist(read_shortlist(path, cfg.vocab_size))
    shortlist = "none" if drafter.shortlist is None else str(drafter.shortlist.shape[0])
    log.info("loaded %s drafter %s (%d layers, block %d, markov r=%d, confidence=%s, quantize=%s, shortlist=%s)",
             cfg.layout, path_or_id, cfg.num_hidden_layers, cfg.block_size, cfg.markov_rank,
             cfg.enable_confidence_head, quantize, shortlist)
    return drafter, cfg


def save_drafter(drafter: Drafter, cfg: DrafterConfig, out_dir: str | Path, dtype: str = "float32", *,
                 extra_config: dict | None = None) -> Path:
    """Write ``config.json`` (in cfg's layout) and ``model.safetensors`` that `load_drafter` reads back.

    ``dtype`` is "float32", "bfloat16" or "float16"; ``extra_config`` (e.g. the target's config
    keys, ``num_anchors``) is merged under the drafter's own keys. The drafter must be unquantized.
    """
    if dtype not in _SAVE_DTYPES:
        raise ValueError(f"unknown save dtype {dtype!r}; choose one of {tuple(_SAVE_DTYPES)}")
    params = dict(tree_flatten(drafter.parameters()))
    if any(not mx.issubdtype(v.dtype, mx.floating) for v in params.values()):
        raise ValueError("cannot save a quantized drafter; save the float weights instead")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = drafter_config_to_raw(cfg, extra_config)
    raw["torch_dtype"] = dtype
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    arrays = {k: v.astype(_SAVE_DTYPES[dtype]) for k, v in params.items()}
    # "format": "pt" lets Transformers-based loaders (DeepSpec, z-lab) open the file too.
    mx.save_safetensors(str(out / "model.safetensors"), arrays, metadata={"format": "pt"})
    if drafter.shortlist is not None:
        write_shortlist(out, drafter.shortlist.tolist())
    return out


def write_shortlist(out_dir: str | Path, ids: list[int], label_coverage: float | None = None) -> Path:
    """Write the draft vocabulary ``ids`` (sorted, distinct) as ``out_dir/shortlist.json``."""
    raw: dict = {"size": len(ids)}
    if label_coverage is not None:
        raw["label_coverage"] = round(label_coverage, 5)
    raw["ids"] = [int(i) for i in ids]
    path = Path(out_dir) / SHORTLIST_FILE
    path.write_text(json.dumps(raw) + "\n")
    return path


def read_shortlist(path: Path, vocab_size: int) -> mx.array | None:
    """The draft vocabulary [S] int32 in ``path/shortlist.json``; None when the file is absent.

    Refused (`DrafterLoadError`, naming the file) unless its ids are a non-empty, strictly
    increasing list of token ids in [0, vocab_size), with ``size`` (if given) their count.
    """
    file = Path(path) / SHORTLIST_FILE
    if not file.exists():
        return None
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DrafterLoadError(f"cannot read {file}: {exc}") from exc
    ids = raw.get("ids") if isinstance(raw, dict) else None
    problem = _shortlist_problem(ids, raw.get("size") if isinstance(raw, dict) else None, vocab_size)
    if problem:
        raise DrafterLoadError(f"{file}: {problem}")
    return mx.array(ids, dtype=mx.int32)


def lookup_published_drafter(target_id: str, mode: str = "dspark") -> str | None:
    """Published drafter id for a target id or path ("dspark" or "dflash" mode), or None if unknown.

    Matches on the base model name, ignoring the org and quantization / packaging suffixes, so
    "Qwen/Qwen3-4B", "mlx-community/Qwen3-4B-4bit" and "/models/Qwen3-4B-MLX-8bit" all match.
    """
    if mode not in ("dspark", "dflash"):
        raise ValueError(f"unknown drafter mode {mode!r}; choose 'dspark' or 'dflash'")
    return PUBLISHED_DRAFTERS.get(target_base_name(target_id), {}).get(mode)


def target_base_name(target_id: str) -> str:
    """Lower-case model stem of a target id or path: "mlx-community/Qwen3-4B-8bit" -> "qwen3-4b"."""
    tokens = Path(target_id.rstrip("/")).name.lower().split("-")
    while len(tokens) > 1 and _is_packaging_token(tokens[-1]):
        tokens.pop()
    return "-".join(tokens)


# ---------------------------------------------------------------- files


def resolve_drafter_path(path_or_id: str) -> Path:
    """Local drafter directory: the path itself, or a Hugging Face snapshot of "org/name"."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise DrafterLoadError(f"{path} has no config.json; not a drafter checkpoint directory")
        return path
    if path.exists():
        raise DrafterLoadError(f"{path} is a file; pass the drafter checkpoint directory")
    if not hub.looks_like_hf_id(path_or_id):
        raise DrafterLoadError(
            f"drafter {path_or_id!r} is neither a local directory nor a Hugging Face id (org/name)")
    return _download(path_or_id)


def read_drafter_config(path: Path, *, num_target_layers: int | None = None) -> DrafterConfig:
    """Parse ``path/config.json`` into a `DrafterConfig` (errors name the file)."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DrafterLoadError(f"cannot read {path / 'config.json'}: {exc}") from exc
    try:
        return normalize_drafter_config(raw, num_target_layers=num_target_layers)
    except DrafterConfigError as exc:
        raise DrafterConfigError(f"{path / 'config.json'}: {exc}") from exc


def read_drafter_weights(path: Path) -> dict[str, mx.array]:
    """All tensors of a (possibly sharded) safetensors checkpoint, by name, in the stored dtype."""
    files = _weight_files(path)
    weights: dict[str, mx.array] = {}
    for file in files:
        try:
            tensors = mx.load(str(file))
        except Exception as exc:  # noqa: BLE001 - MLX raises plain RuntimeError/ValueError on bad files
            raise DrafterLoadError(f"cannot read weights file {file}: {exc}") from exc
        for name, value in tensors.items():
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if name in weights:
                raise DrafterLoadError(f"tensor {name!r} appears in more than one shard of {path}")
            weights[name] = value
    return weights


def check_weight_keys(drafter: Drafter, weights: dict[str, mx.array]) -> None:
    """Raise `DrafterLoadError` unless ``weights`` has exactly the drafter's tensors, with its shapes."""
    expected = dict(tree_flatten(drafter.parameters()))
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    cfg = drafter.config
    where = f"{cfg.architecture} checkpoint ({cfg.layout} layout)"
    if missing or unexpected:
        parts = [_listing("missing", missing), _listing("unexpected", unexpected)]
        hint = ""
        if any(k.startswith("model.") for k in unexpected):
            hint = " (keys carry a 'model.' prefix; the expected names have none)"
        listing = "; ".join(p for p in parts if p)
        raise DrafterLoadError(f"{where} does not match its config: {listing}{hint}")
    bad = [f"{k}: checkpoint {tuple(weights[k].shape)} vs expected {tuple(expected[k].shape)}"
           for k in sorted(expected) if tuple(weights[k].shape) != tuple(expected[k].shape)]
    if bad:
        raise DrafterLoadError(f"{where} has {len(bad)} shape mismatch(es): " + "; ".join(bad[:_MAX_LISTED]))


# ---------------------------------------------------------------- helpers


def _listing(kind: str, names: list[str]) -> str:
    if not names:
        return ""
    more = f", ... ({len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else ""
    return f"{len(names)} {kind} key(s): " + ", ".join(names[:_MAX_LISTED]) + more


def _weight_files(path: Path) -> list[Path]:
    index = path / _INDEX_FILE
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise DrafterLoadError(f"cannot read shard index {index}: {exc}") from exc
        files = [path / n for n in names]
        absent = [f.name for f in files if not f.exists()]
        if absent:
            raise DrafterLoadError(f"{index} lists shard(s) that are not present: {', '.join(absent)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DrafterLoadError(f"{path} has no *.safetensors weights")
    return files


def _adopt_own_embeddings(cfg: DrafterConfig, weights: dict[str, mx.array]) -> DrafterConfig:
    # Legacy SpecForge DSpark exports differ: most reuse the target's embedding, some store copies.
    if cfg.architecture == LEGACY_DSPARK_ARCH and "embed_tokens.weight" in weights:
        return replace(cfg, owns_embeddings=True, tie_word_embeddings="lm_head.weight" not in weights)
    return cfg


def _check_target_fit(cfg: DrafterConfig, weights: dict[str, mx.array], vocab: int, num_layers: int | None,
                      hidden: int | None) -> None:
    if cfg.vocab_size != vocab:
        raise DrafterLoadError(f"vocabulary mismatch: the drafter has vocab_size {cfg.vocab_size} but the "
                               f"target has {vocab}; this drafter was trained for a different target")
    for name in ("embed_tokens.weight", "lm_head.weight", "markov_head.markov_w1.weight"):
        if name in weights and weights[name].shape[0] != vocab:
            raise DrafterLoadError(f"vocabulary mismatch: {name} has {weights[name].shape[0]} rows but the "
                                   f"target vocabulary has {vocab}")
    if num_layers is not None and num_layers != cfg.num_target_layers:
        raise DrafterLoadError(f"the drafter was trained on a {cfg.num_target_layers}-layer target "
                               f"(taps {list(cfg.target_layer_ids)}); this target has {num_layers} layers")
    if hidden is not None and hidden != cfg.hidden_size:
        raise DrafterLoadError(f"hidden size mismatch: drafter {cfg.hidden_size}, target {hidden}")


def _shortlist_problem(ids, size, vocab_size: int) -> str | None:
    """Why ``ids`` is not a usable draft vocabulary, or None."""
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return "'ids' must be a list of integer token ids"
    if not ids:
        return "'ids' is empty; a drafter needs at least one token to draft"
    if any(not 0 <= i < vocab_size for i in ids):
        return f"token ids must be in [0, {vocab_size}) (the target's vocabulary)"
    if any(b <= a for a, b in zip(ids, ids[1:])):
        return "'ids' must be sorted and without duplicates"
    if size is not None and size != len(ids):
        return f"'size' is {size} but 'ids' holds {len(ids)} ids"
    return None


def _is_packaging_token(token: str) -> bool:
    if token in _PACKAGING_TOKENS:
        return True
    # "4bit", "8bit", "q4_k_m", "q8_0", or a date stamp like "053125"
    return (token.endswith("bit") and token[:-3].isdigit()) or (token[:1] == "q" and token[1:2].isdigit()) \
        or (token.isdigit() and len(token) >= 6)


def _download(repo_id: str) -> Path:
    try:
        return hub.download(repo_id, _HF_PATTERNS, what="drafter")
    except hub.HubUnavailableError as exc:
        raise DrafterLoadError(str(exc)) from exc
