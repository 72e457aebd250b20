"""Public types of the engine: configuration, requests, events and errors. Dataclasses only.

Vocabulary (vLLM's words, used throughout the engine; docs/method.md has the method):
    target      the model whose output we promise (verified every round)
    drafter     what proposes the drafts: a small model reading the target's hidden states
                (kinds "dspark", "dflash"), prompt lookup (kind "lookup", no model), or both,
                chosen per round (kinds "dspark+lookup", "dflash+lookup": `hybrid` mode)
    round       one draft -> verify -> accept -> roll back cycle
    num_draft   draft tokens verified in a round (`l` in formulas); 0 is a plain decode step
    cap         the most drafts a round may verify (`--max-draft`; `auto` picks it per round)
    max_drafts  the most drafts one drafter pass can propose (its block size, less one for z-lab
                DFlash): the largest cap
    slot        a draft's 1-based place in the round: slot k drafts position anchor + k
    accepted    draft tokens the accept rule kept (`num_accepted`)
    recovered   the token sampled from the residual distribution after a rejection
    bonus       the extra target token after all drafts were accepted

Every request produces zero or more `TokenEvent`s (one per round) and then exactly one terminal
event: `Finished` or `Failed`. Nothing raises across the worker thread boundary; errors are values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# "auto": a trained drafter when one is known for the target, else lookup (engine/runtime.py).
# "hybrid": a trained drafter and lookup, the better one chosen per round (else lookup alone).
Mode = Literal["dspark", "dflash", "lookup", "hybrid", "auto", "baseline"]
DrafterKind = Literal["dspark", "dflash", "lookup", "dspark+lookup", "dflash+lookup"]
SamplerName = Literal["rejection", "seed-stable"]
# The embedded default model's weights: float32 (dequantized once), its GGUF's own 4/8-bit tensors,
# or auto: stored where quantized products are fast (engine/loading/target.py, resolve_precision).
Precision = Literal["auto", "float32", "stored"]
WorkerState = Literal["loading", "ready", "dead"]
FinishReason = Literal["stop", "length"]

MODES: tuple[str, ...] = ("dspark", "dflash", "lookup", "hybrid", "auto", "baseline")
SAMPLERS: tuple[str, ...] = ("rejection", "seed-stable")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. `temperature` <= 1e-5 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None  # None: the engine draws a fresh seed per request
    sampler: SamplerName | None = None  # None: the engine's configured default
    # Logit processors on the raw target logits, before temperature (see engine/processors.py).
    presence_penalty: float = 0.0  # minus this once for every token already generated
    frequency_penalty: float = 0.0  # minus this times the token's count in the generated text
    repetition_penalty: float = 1.0  # > 0; tokens of prompt + output: logit / r if > 0 else * r
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), bias clamped to [-100, 100]


GrammarKind = Literal["json_schema", "regex", "lark"]


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must match (engine/grammar.py): a JSON Schema, a regex or a Lark grammar
    (llguidance's dialect, which may embed JSON schemas with `%json`)."""

    kind: GrammarKind
    source: str  # the schema as JSON text, the regex, or the grammar
    param: str | None = None  # the request field it came from, named in errors


@dataclass(frozen=True)
class ImageInput:
    """One image of a prompt, as the client sent it once decoded from its URL: the encoded file
    (PNG, JPEG, WebP, ...) and the SHA-256 hex digest of those bytes (what caches key it by)."""

    data: bytes
    digest: str
    media_type: str = ""  # the content type the client or server declared, e.g. "image/png"


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: prompt token ids in, at most `max_tokens` new tokens out."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()  # stop strings; the matched string is not emitted
    stop_token_ids: tuple[int, ...] = ()  # in addition to the tokenizer's EOS ids
    logprobs: int | None = None  # None: off; 0..20: each token's logprob and that many top alternatives
    grammar: GrammarSpec | None = None  # constrained decoding; None: free text
    # Images, in prompt order: the i-th fills the i-th image placeholder token of `prompt_ids`
    # (`EngineInfo.image_token_id`). Only targets with a vision tower take them (`EngineInfo.vision`).
    images: tuple[ImageInput, ...] = ()
    # Decode this request without drafts (plain target steps) whatever the engine's mode: the
    # per-request baseline a side-by-side comparison measures against. Its stats say mode
    # "baseline"; it neither reads nor fills the prefix cache (its states lack a drafter's context).
    baseline: bool = False


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding settings of the engine."""

    mode: Mode = "dspark"
    drafter: str | None = None  # path or HF id; None: shipped/published drafter for the target
    max_draft: int | Literal["auto"] = "auto"  # cap on drafts verified per round
    confidence_threshold: float | None = None  # stop drafting once the prefix survival < theta
    sampler: SamplerName = "rejection"  # default lossless sampler for temperature > 0
    drafter_quantization: str | None = None  # None, "bf16", "8bit", "4bit"
    lookup_min_ngram: int = 2  # shortest context match lookup drafts from (3 tokens are tried first)
    # Tokens of recent outputs (all requests) lookup may also draft from; 0: off. Off by default:
    # it makes one caller's timing depend on another caller's outputs.
    lookup_history: int = 0


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine worker needs to start."""

    model: str | None = None  # mlx-lm directory or HF id; None: the embedded default
    # The embedded default's weights (other models are served as their directories store them).
    precision: Precision = "auto"
    spec: SpecConfig = SpecConfig()
    max_queue: int = 16  # requests waiting beyond the running one; more are refused (overloaded)
    # Bytes of finished requests' caches kept for later prompts that share their prefix
    # (engine/prefix_cache.py); 0: off. Off unless asked for, so that benchmarks and evaluations
    # measure cold prefills; `dspark serve` turns it on (server/settings.py). None: sized for this
    # machine's memory (engine/prefix_cache.py).
    prefix_cache_bytes: int | None = 0


@dataclass(frozen=True)
class EngineInfo:
    """What is being served, for /v1/models and /health."""

    model_id: str
    model_path: str
    mode: Mode
    drafter: str | None
    cap: int | None  # effective draft cap (the auto choice once measured); None for baseline
    context_length: int
    sampler: SamplerName
    vocab_size: int = 0  # token ids must be < vocab_size (0: unknown, not checked)
    requested_mode: Mode | None = None  # what was asked for, when it differs from `mode`
    mode_note: str | None = None  # why `mode` differs from the request (e.g. no drafter known)
    drafter_kind: DrafterKind | None = None  # what proposes the drafts; None in baseline mode
    draft_vocab: int | None = None  # the trained drafter's shortlist size; None: it drafts over the whole vocabulary
    # The cross-request lookup history's size, live (updated after each request); None when off.
    lookup_history: HistoryUsage | None = field(default=None, compare=False)
    # The prefix cache's size and hit counts, live; None when it is off.
    prefix_cache: PrefixCacheUsage | None = field(default=None, compare=False)
    vision: bool = False  # the target takes images (an mlx-vlm model with a vision tower)
    # The token id that stands for one image in a rendered prompt (None: no images)
    image_token_id: int | None = None


@dataclass
class HistoryUsage:
    """What the cross-request lookup history (`--lookup-history`) holds, updated in place by the engine
    thread after each request (read by /metrics at scrape time)."""

    budget_tokens: int  # the most tokens it keeps (older ones are evicted)
    tokens: int  # tokens held now (output tokens plus one separator per output)
    approx_bytes: int  # approximate memory of the tokens and the n-gram tables


@dataclass
class PrefixCacheUsage:
    """What the prefix cache holds and how often prompts hit it, updated in place by the engine thread
    (read by /health and /metrics)."""

    budget_bytes: int  # the most bytes it holds (least recently used states are evicted)
    bytes: int = 0  # held now
    entries: int = 0
    tokens: int = 0  # positions held, over all entries
    hit_tokens: int = 0  # prompt tokens restored from the cache instead of prefilled (all requests)
    miss_tokens: int = 0  # prompt tokens prefilled
    evictions: int = 0


@dataclass
class Usage:
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, those restored from the prefix cache (not prefilled)


@dataclass
class KindStats:
    """Rounds and drafts of one drafter kind within a request (`SpecStats.by_kind`)."""

    rounds: int = 0  # rounds that verified drafts of this kind
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    empty_rounds: int = 0  # asked for drafts but proposed none (lookup: no match), run as plain steps
    history_rounds: int = 0  # lookup rounds whose drafts came from other requests' outputs (--lookup-history)
    history_accepted_tokens: int = 0  # accepted drafts of those rounds


@dataclass
class SpecStats:
    """Per-request speculative statistics."""

    mode: Mode
    cap: int | None
    rounds: int = 0
    drafted_tokens: int = 0  # draft tokens sent to verification
    accepted_tokens: int = 0  # of those, accepted
    accepted_by_position: list[int] = field(default_factory=list)  # [cap] accepted at slot i
    verified_by_position: list[int] = field(default_factory=list)  # [cap] verified at slot i
    time_prefill_s: float = 0.0
    prompt_cached_tokens: int = 0  # prompt tokens restored from the prefix cache, not prefilled
    prefill_saved_s: float = 0.0  # estimated prefill time those tokens would have taken
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    time_accept_s: float = 0.0  # accept rule, commit and cache roll-back
    time_other_s: float = 0.0
    generated_tokens: int = 0  # all output tokens, including the one sampled at prefill
    round_tokens: int = 0  # tokens committed by rounds (excludes the prefill token)
    grammar_masks: int = 0  # grammar mask rows computed (drafts, verify rows, plain steps); 0: no grammar
    time_grammar_s: float = 0.0  # computing them and advancing the matcher (inside the times above)
    by_kind: dict[str, KindStats] = field(default_factory=dict)  # drafter kind -> its rounds and drafts

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per round (accepted drafts + the recovered/bonus token), tau."""
        return self.round_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Conditional acceptance rate at each draft slot (accepted / verified)."""
        return [a / v if v else 0.0 for a, v in zip(self.accepted_by_position, self.verified_by_position)]

    @property
    def decode_time_s(self) -> float:
        """Time spent after prefill."""
        return self.time_draft_s + self.time_verify_s + self.time_accept_s + self.time_other_s

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of decode time (prefill excluded)."""
        return self.generated_tokens / self.decode_time_s if self.decode_time_s > 0 else 0.0

    def as_dict(self) -> dict:
        """JSON-ready dict including the derived rates."""
        return {
            "mode": self.mode,
            "cap": self.cap,
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "generated_tokens": self.generated_tokens,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_by_position": [round(x, 4) for x in self.acceptance_by_position],
            "time_prefill_s": round(self.time_prefill_s, 4),
            "prompt_cached_tokens": self.prompt_cached_tokens,
            "prefill_saved_s": round(self.prefill_saved_s, 4),
            "time_draft_s": round(self.time_draft_s, 4),
            "time_verify_s": round(self.time_verify_s, 4),
            "time_accept_s": round(self.time_accept_s, 4),
            "time_other_s": round(self.time_other_s, 4),
            "grammar_masks": self.grammar_masks,
            "time_grammar_s": round(self.time_grammar_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "by_kind": {kind: dict(vars(k)) for kind, k in self.by_kind.items()},
        }


@dataclass
class TokenLogprob:
    """Log-probability of one generated token, with the most likely alternatives at its position.

    Values are the target model's RAW log-softmax at that position: before logit bias, penalties,
    temperature and top-k/top-p/min-p (vLLM's and OpenAI's default). They come from the target's
    own forward, never from the drafter, so speculative and baseline decoding report the same.
    `token` is the id's text decoded alone (special tokens kept).
    """

    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]]  # (id, token text, logprob), most likely first


@dataclass
class TokenEvent:
    """Tokens committed in one round and the text they released (may be empty: held back)."""

    token_ids: list[int]
    text: str
    # With GenerationRequest.logprobs: one entry per visible token (the ending EOS/stop id has none).
    logprobs: list[TokenLogprob] | None = None
    # How many of `token_ids` (the first ones) were drafts the target accepted; the rest are the
    # target's own tokens (the prefill token, a plain step's, a round's correction or bonus).
    drafted: int = 0


@dataclass
class Finished:
    """Terminal event: the request completed."""

    reason: FinishReason
    usage: Usage
    stats: SpecStats
    text: str = ""  # any text released at the end (held-back bytes, flushed stop candidates)
    stop_sequence: str | None = None  # the stop string that ended the text (reason "stop"), if one did


@dataclass
class Failed:
    """Terminal event: the request failed."""

    error: EngineError


Event = TokenEvent | Finished | Failed


class EngineError(Exception):
    """Base class of engine errors; `code` is a short machine-readable reason."""

    code = "engine_error"


class EngineInputError(EngineError, ValueError):
    """The request cannot be served as given (a client error)."""

    code = "invalid_request"

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ContextLengthExceeded(EngineInputError):
    """Prompt plus max_tokens exceed the model's context window."""

    code = "context_length_exceeded"


class EngineCancelled(EngineError):
    """The request was cancelled (its consumer went away); nobody normally sees this."""

    code = "cancelled"


class EngineOverloaded(EngineError):
    """The admission queue is full; retry later."""

    code = "overloaded"


class EngineDead(EngineError):
    """The engine worker stopped or failed to load; nothing can be served."""

    code = "engine_dead"


class EngineNotReady(EngineError):
    """The engine is still loading models."""

    code = "engine_loading"
