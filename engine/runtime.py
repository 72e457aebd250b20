"""Everything loaded for serving: target, drafter, tokenizer, scheduler factory and EngineInfo.

The effective mode is decided here once and reported through `EngineInfo` (and so /health and
/v1/models): when dspark/dflash is asked for but no drafter exists for the target, the engine runs
baseline and says so loudly, never silently. `auto` serves a trained drafter when one is known for
the target and prompt lookup (engine/lookup.py) otherwise; `lookup` needs no drafter at all. `hybrid`
loads the trained drafter `auto` would and drafts each round with it or with lookup, whichever the
measured cost curve favours (lookup alone when no trained drafter is known).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.api import (
    ContextLengthExceeded, EngineConfig, EngineInfo, EngineInputError, GrammarSpec, ImageInput, SpecConfig, SpecStats,
)
from engine.grammar import CompiledGrammar, compile_grammar, grammar_tokenizer
from engine.loading.default_model import DEFAULT_MODEL_NAME
from engine.loading.drafter import load_drafter, lookup_published_drafter
from engine.loading.target import load_target_with_vision
from engine.lookup import (
    DEFAULT_MAX_DRAFTS, DEFAULT_MAX_NGRAM, HybridDrafter, LookupConfig, LookupDrafter, LookupHistory, split_drafter,
)
from engine.models.target import Target
from engine.prefix_cache import PrefixCache, PrefixState, prefix_cache_for
from engine.scheduler import (
    AUTO_PRIOR, AutoScheduler, CostCurve, HybridScheduler, LookupScheduler, Scheduler, ThresholdScheduler,
)
from engine.seams import DrafterLike, TokenizerLike, drafter_kind

if TYPE_CHECKING:
    from engine.spec import SpecDecoder
    from engine.vision import PromptInputs, Vision

log = logging.getLogger(__name__)

# Drafters we train and ship for the embedded default model, by mode (none is shipped yet: a
# drafter ships only when it pays, see docs/drafter-runs/).
SHIPPED_DIR = Path(__file__).resolve().parent / "drafters"
SHIPPED_DRAFTERS = {"dspark": "smollm2-135m-dspark", "dflash": "smollm2-135m-dflash"}
TRAINED_MODES = ("dspark", "dflash")  # the order `auto` and `hybrid` look for a trained drafter in


class NoDrafterError(ValueError):
    """Speculative mode requested but no drafter is known for the target."""


@dataclass
class Runtime:
    """Loaded models and the decisions derived from them."""

    target: Target
    drafter: DrafterLike | LookupDrafter | HybridDrafter | None
    tokenizer: TokenizerLike
    info: EngineInfo  # what is reported (/health, /v1/models); never read back as configuration
    eos_ids: frozenset[int]
    spec: SpecConfig
    curve: CostCurve | None = None  # measured round costs (every speculative mode)
    cap: int | None = None  # fixed cap, or auto's starting cap; None in baseline mode
    history: LookupHistory | None = None  # recent outputs lookup drafts from (--lookup-history); None: off
    prefix_cache: PrefixCache | None = None  # finished requests' states for later prompts; None: off
    vision: Vision | None = None  # the image half of an mlx-vlm target; None: text only
    _grammar_tokenizer: object | None = field(default=None, init=False, repr=False)  # built on first use

    def compiled_grammar(self, spec: GrammarSpec | None) -> CompiledGrammar | None:
        """`spec` compiled (cached by its text) and bound to this model's tokenizer; None for no grammar."""
        if spec is None:
            return None
        vocab = self.target.vocab_size
        if self._grammar_tokenizer is None:  # about a second, so only once a request asks for a grammar
            self._grammar_tokenizer = grammar_tokenizer(self.tokenizer, vocab, self.eos_ids)
        return CompiledGrammar(self._grammar_tokenizer, compile_grammar(spec), vocab)

    def expand_images(self, prompt: list[int], images: tuple[ImageInput, ...]) -> tuple[list[int], PromptInputs]:
        """The prompt with its image placeholders expanded and its input embeddings (engine/vision.py);
        refused for a text-only target or when the expanded prompt leaves no room for the answer."""
        if self.vision is None:
            raise EngineInputError(f"the model {self.info.model_id} does not take images", param="messages")
        expanded = self.vision.expand(prompt, images)
        if len(expanded.ids) >= self.info.context_length:
            raise ContextLengthExceeded(f"This model's maximum context length is {self.info.context_length} tokens; "
                                        f"the messages with their images take {len(expanded.ids)}.", param="messages")
        return expanded.ids, expanded.inputs

    def match_prefix(self, prompt: list[int]) -> tuple[PrefixState, int] | None:
        """The prefix-cache state to start `prompt` from and how many of its positions it gives
        (None: the cache is off or holds no common prefix)."""
        return self.prefix_cache.match(prompt) if self.prefix_cache is not None else None

    def account_prefill(self, stats: SpecStats, prompt_tokens: int) -> None:
        """After a prefill: feed the cache's prefill-rate estimate and set the request's estimated
        prefill time saved by cached tokens."""
        if self.prefix_cache is None:
            return
        cached = stats.prompt_cached_tokens
        self.prefix_cache.observe_prefill(prompt_tokens - cached, stats.time_prefill_s)
        stats.prefill_saved_s = self.prefix_cache.estimate_prefill_s(cached)

    def keep_prefix(self, decoder: SpecDecoder) -> None:
        """Put a finished (or cleanly stopped) request's committed state into the prefix cache.

        A failure here is a bug in the cache's bookkeeping: it is logged and the cache emptied, so
        that it never costs a request its answer or serves a state it could not check."""
        if self.prefix_cache is None:
            return
        try:
            self.prefix_cache.insert(decoder.capture())
        except Exception:
            log.exception("prefix cache: could not keep a request's state; emptying the cache")
            self.prefix_cache.clear()

    def remember(self, output_ids: list[int]) -> None:
        """Add a finished request's output to the lookup history (nothing when it is off)."""
        if self.history is not None:
            self.history.add(output_ids)

    @property
    def decode_threads(self) -> int | None:
        """BLAS threads for decode rounds (measured with the cost curve); None leaves the BLAS as loaded."""
        return getattr(self.curve, "decode_threads", None)

    def make_scheduler(self) -> Scheduler | None:
        """A fresh per-request scheduler (None in baseline mode)."""
        if self.drafter is None:
            return None
        cap = self.cap or 1
        spec, has_conf = self.spec, self.drafter.has_confidence
        if isinstance(self.drafter, HybridDrafter):
            return hybrid_scheduler(self.drafter, self.curve, spec.max_draft)
        if spec.max_draft == "auto" and self.curve is not None:
            if drafter_kind(self.drafter) == "lookup":
                return LookupScheduler(self.drafter.config.max_drafts, self.curve)
            return AutoScheduler(self.drafter.config.max_drafts, self.curve, use_confidence=has_conf)
        if spec.confidence_threshold is not None and has_conf:
            return ThresholdScheduler(cap, spec.confidence_threshold)
        return Scheduler(cap)


def hybrid_scheduler(drafter: HybridDrafter, curve: CostCurve, max_draft: int | str = "auto") -> HybridScheduler:
    """A fresh `HybridScheduler`: both kinds' caps follow `curve` (the trained drafter's, with its
    draft costs; lookup's rounds cost the verify alone), at most a fixed `max_draft` if given."""
    bound = max_draft if isinstance(max_draft, int) else None
    trained_cap = min(drafter.trained.config.max_drafts, bound or drafter.trained.config.max_drafts)
    trained = AutoScheduler(trained_cap, curve, use_confidence=drafter.has_confidence)
    free = replace(curve, draft_fixed_s=0.0, draft_per_token_s=0.0)
    return HybridScheduler(trained, LookupScheduler(drafter.lookup.config.max_drafts, free))


def _draft_vocab(drafter) -> int | None:
    """The trained drafter's shortlist size (its draft vocabulary), or None (none, or no trained drafter)."""
    shortlist = getattr(split_drafter(drafter)[0], "shortlist", None)
    return None if shortlist is None else int(shortlist.shape[0])


def _model_id(spec_model: str | None, path: Path) -> str:
    if not spec_model:
        return DEFAULT_MODEL_NAME
    return path.name if Path(spec_model).expanduser().is_dir() else spec_model


def _drafter_source(spec: SpecConfig, model: str | None) -> str | None:
    """The trained drafter to load: --drafter, else the shipped or published one for the mode
    (`auto`: for dspark, then dflash); None when there is none or the mode needs none."""
    if spec.mode in ("baseline", "lookup"):
        return None
    if spec.drafter:
        return spec.drafter
    modes = TRAINED_MODES if spec.mode in ("auto", "hybrid") else (spec.mode,)
    return next((found for mode in modes if (found := _known_drafter(mode, model))), None)


def _known_drafter(mode: str, model: str | None) -> str | None:
    if model is None and mode in SHIPPED_DRAFTERS:
        shipped = SHIPPED_DIR / SHIPPED_DRAFTERS[mode]
        return str(shipped) if (shipped / "config.json").exists() else None
    return lookup_published_drafter(model, mode) if model else None


def _mode_without_trained_drafter(spec: SpecConfig, model: str | None) -> tuple[str, str | None]:
    """(mode, note) when no trained drafter is loaded: lookup and baseline as asked, `auto` falls
    back to lookup, dspark and dflash to baseline (loudly: the note is served in /health)."""
    if spec.mode in ("baseline", "lookup"):
        return spec.mode, None
    name = model or DEFAULT_MODEL_NAME
    if spec.mode in ("auto", "hybrid"):
        note = f"{spec.mode}: no trained drafter is known for {name}: drafting by prompt lookup"
        log.info(note)
        return "lookup", note
    note = (f"no {spec.mode} drafter is known for {name}: serving in baseline mode (plain decoding); pass "
            "--drafter PATH_OR_ID to enable speculation, or --mode lookup for drafts copied from the context")
    log.warning(note)
    return "baseline", note


def lookup_config(spec: SpecConfig) -> LookupConfig:
    """The lookup drafter's settings: matches of 3 tokens down to `lookup_min_ngram`, and a largest
    cap of DEFAULT_MAX_DRAFTS (or the fixed --max-draft)."""
    max_drafts = spec.max_draft if isinstance(spec.max_draft, int) else DEFAULT_MAX_DRAFTS
    return LookupConfig(min_ngram=spec.lookup_min_ngram, max_ngram=max(DEFAULT_MAX_NGRAM, spec.lookup_min_ngram),
                        max_drafts=max_drafts)


def _model_args(model):
    """The model's configuration: mlx-lm models keep it in `args`, mlx-vlm language models in `config`."""
    return getattr(model, "args", None) or getattr(model, "config", None)


def _load_drafter(source: str, target: Target, model, quantize: str | None) -> DrafterLike:
    drafter, cfg = load_drafter(
        source, target_vocab_size=target.vocab_size, target_num_layers=target.num_layers,
        target_hidden_size=getattr(_model_args(model), "hidden_size", None), quantize=quantize,
    )
    if drafter.needs_target_binding:
        drafter.bind_target_model(model)
    return drafter


def build_runtime(config: EngineConfig, progress=None) -> Runtime:
    """Load the target (and drafter) for `config`; decides the effective mode."""
    spec = config.spec
    model, tokenizer, path, vision = load_target_with_vision(config.model, progress, config.precision)
    source = _drafter_source(spec, config.model)
    note = None
    history = None
    if source is not None:
        target = Target(model, load_drafter_config_taps(source))
        drafter = _load_drafter(source, target, model, spec.drafter_quantization)
        mode = drafter_kind(drafter) if spec.mode == "auto" else spec.mode
        if mode == "hybrid":
            history = _history(spec)
            drafter = HybridDrafter(drafter, LookupDrafter(lookup_config(spec), history))
    else:
        mode, note = _mode_without_trained_drafter(spec, config.model)
        history = _history(spec) if mode == "lookup" else None
        # Lookup reads no hidden states, so its target taps nothing (as in baseline mode).
        target, drafter = Target(model), (LookupDrafter(lookup_config(spec), history) if mode == "lookup" else None)
    if spec.lookup_history and history is None:
        log.warning("--lookup-history is ignored in %s mode: only lookup and hybrid draft from it", mode)
    target.check_taps()
    curve, cap = None, None
    if drafter is not None:
        # Every speculative mode gets the measured curve: `auto` chooses caps with it, and all of
        # them decode at its BLAS thread count (cached per machine, so measured once). A hybrid's
        # is the trained drafter's, timed out to the longer of the two kinds' largest caps.
        max_drafts = drafter.config.max_drafts
        timed = drafter.trained if isinstance(drafter, HybridDrafter) else drafter
        longest = max(max_drafts, drafter.lookup.config.max_drafts) if timed is not drafter else max_drafts
        target.max_rollback = max(target.max_rollback, longest + 1)  # a round's drafts and its bonus row
        curve = _round_costs(target, timed, str(path), source, longest)
        cap = initial_auto_cap(curve, max_drafts) if spec.max_draft == "auto" else min(int(spec.max_draft), max_drafts)
    prefix_cache = prefix_cache_for(target, config.prefix_cache_bytes)
    info = EngineInfo(
        model_id=_model_id(config.model, path), model_path=str(path), mode=mode, drafter=source, cap=cap,
        context_length=_context_length(model), sampler=spec.sampler, vocab_size=target.vocab_size,
        requested_mode=spec.mode if spec.mode != mode else None, mode_note=note, drafter_kind=drafter_kind(drafter),
        draft_vocab=_draft_vocab(drafter),
        lookup_history=history.usage if history is not None else None,
        prefix_cache=prefix_cache.usage if prefix_cache is not None else None,
        vision=vision is not None, image_token_id=vision.image_token_id if vision is not None else None,
    )
    return Runtime(target, drafter, tokenizer, info, eos_ids(tokenizer), spec, curve, cap, history, prefix_cache,
                   vision)


def _history(spec: SpecConfig) -> LookupHistory | None:
    """The cross-request lookup history of `--lookup-history TOKENS` (None when 0: the default)."""
    if not spec.lookup_history:
        return None
    cfg = lookup_config(spec)
    return LookupHistory(spec.lookup_history, cfg.min_ngram, cfg.max_ngram)


def _round_costs(target: Target, drafter, model_path: str, source: str | None, max_drafts: int,
                 refresh: bool = False) -> CostCurve:
    """The measured round-cost curve (cached per machine and shapes): lookup's has no draft cost."""
    from engine.costs import load_or_measure

    return load_or_measure(target, drafter, model_path, source, max_drafts, refresh=refresh)


def initial_auto_cap(curve: CostCurve, max_drafts: int) -> int:
    """The cap `auto` reports before any round: the curve's best at the scheduler's prior acceptance."""
    return curve.best_cap([AUTO_PRIOR] * max_drafts, max_drafts)[0] or 1


def with_fresh_curve(runtime: Runtime) -> Runtime:
    """The runtime with its auto cost curve measured again now (and re-cached), e.g. for a benchmark."""
    if runtime.curve is None:
        return runtime
    max_drafts = runtime.drafter.config.max_drafts
    timed, longest = runtime.drafter, max_drafts
    if isinstance(timed, HybridDrafter):
        timed, longest = timed.trained, max(max_drafts, timed.lookup.config.max_drafts)
    curve = _round_costs(runtime.target, timed, runtime.info.model_path, runtime.info.drafter, longest, refresh=True)
    if runtime.spec.max_draft != "auto":
        return replace(runtime, curve=curve)
    cap = initial_auto_cap(curve, max_drafts)
    return replace(runtime, curve=curve, cap=cap, info=replace(runtime.info, cap=cap))


def load_drafter_config_taps(source: str) -> tuple[int, ...]:
    """The tapped target layers of a drafter, read from its config before loading weights."""
    from engine.loading.drafter import read_drafter_config, resolve_drafter_path

    return read_drafter_config(resolve_drafter_path(source)).target_layer_ids


def eos_ids(tokenizer: TokenizerLike) -> frozenset[int]:
    """The tokenizer's end-of-sequence ids (all of them, for tokenizers that list several)."""
    ids = set(getattr(tokenizer, "eos_token_ids", None) or [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def _context_length(model) -> int:
    args = _model_args(model)
    for name in ("max_position_embeddings", "max_seq_len", "context_length"):
        value = getattr(args, name, None)
        if value:
            return int(value)
    return int(os.environ.get("DSPARK_CONTEXT_LENGTH", "4096"))
