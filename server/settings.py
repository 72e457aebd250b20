"""Server settings, read from `DSPARK_*` environment variables and the `dspark serve` flags.

`ServerSettings.to_engine_config()` is the one place where server settings become engine config.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.api import EngineConfig, SpecConfig
from server.images import ImageLimits

ENV_PREFIX = "DSPARK_"


class ServerSettings(BaseSettings):
    """Everything `dspark serve` can be told; each field is also the env var `DSPARK_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # Model and speculative decoding (the same flags as `dspark generate`).
    model: str | None = Field(default=None, description="mlx-lm model directory or HF id; None: embedded default")
    drafter: str | None = Field(default=None, description="drafter path or HF id; None: the one for the target")
    mode: Literal["dspark", "dflash", "lookup", "hybrid", "auto", "baseline"] = Field(default="dspark",
                                                                                     description="decoding mode")
    sampler: Literal["rejection", "seed-stable"] = Field(default="rejection", description="default lossless sampler")
    max_draft: int | Literal["auto"] = Field(default="auto", description="drafts verified per round, or auto")
    confidence_threshold: float | None = Field(default=None, ge=0, le=1, description="stop drafting below this")
    drafter_quantization: Literal["bf16", "8bit", "4bit"] | None = Field(default=None, description="drafter dtype")
    lookup_min_ngram: int = Field(default=2, ge=1, description="shortest context match lookup drafts from")
    lookup_history: int = Field(default=0, ge=0, description="tokens of recent outputs lookup drafts from; 0: off")
    prefix_cache_mb: int | None = Field(default=None, ge=0, description="MiB of finished requests' caches kept for "
                                        "prompts that share their prefix; 0: off; None: sized for this machine")

    # HTTP.
    host: str = Field(default="127.0.0.1", description="interface to bind")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port (0: any free port)")
    api_key: str | None = Field(default=None, repr=False, description="Bearer key on every route but /health")
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="CORS origins (comma-separated in the env); empty: CORS off"
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="extra Host names answered besides localhost (comma-separated in the env); '*': no Host check",
    )
    strict_params: bool = Field(default=False, description="refuse ignored request fields (OpenAI conformance)")
    max_queue: int = Field(default=16, ge=0, description="requests waiting behind the running one before 429")
    keepalive_s: float = Field(default=15.0, gt=0, description="stream silence before an SSE keep-alive comment")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, description="largest request body (else 413)")
    drain_grace_s: float = Field(default=30.0, ge=0, description="after SIGTERM, how long requests may still run")
    ui: bool = Field(default=True, description="serve the chat page at / (its static files need no API key)")

    # Images in requests (vision models; server/images.py).
    image_max_bytes: int = Field(default=20 * 1024 * 1024, ge=1, description="largest image, fetched or data: URL")
    image_timeout_s: float = Field(default=10.0, gt=0, description="longest fetch of one image URL, redirects included")
    image_max_pixels: int = Field(default=50_000_000, ge=1, description="most pixels of one image (bomb guard)")
    allow_private_image_urls: bool = Field(
        default=False, description="fetch image URLs on loopback and private addresses too (SSRF guard off)")

    @field_validator("allowed_origins", "allowed_hosts", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """Accept `a,b` from the environment or the command line as well as a list."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("api_key", "model", "drafter", "confidence_threshold", "drafter_quantization", "prefix_cache_mb",
                     mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        """An empty env var (`DSPARK_API_KEY=`) means unset, not an empty key."""
        return None if value == "" else value

    @field_validator("max_draft")
    @classmethod
    def _positive_draft(cls, value: int | str) -> int | str:
        """A fixed cap must be at least one draft token."""
        if isinstance(value, int) and value < 1:
            raise ValueError("max_draft must be >= 1 or 'auto'")
        return value

    def to_engine_config(self) -> EngineConfig:
        """The engine configuration these settings describe."""
        spec = SpecConfig(mode=self.mode, drafter=self.drafter, max_draft=self.max_draft, sampler=self.sampler,
                          confidence_threshold=self.confidence_threshold,
                          drafter_quantization=self.drafter_quantization, lookup_min_ngram=self.lookup_min_ngram,
                          lookup_history=self.lookup_history)
        cache_bytes = None if self.prefix_cache_mb is None else self.prefix_cache_mb * 2**20  # None: the engine sizes it
        return EngineConfig(model=self.model, spec=spec, max_queue=self.max_queue, prefix_cache_bytes=cache_bytes)

    def image_limits(self) -> ImageLimits:
        """What one image of a request may cost (server/images.py)."""
        return ImageLimits(max_bytes=self.image_max_bytes, timeout_s=self.image_timeout_s,
                           max_pixels=self.image_max_pixels, allow_private=self.allow_private_image_urls)

    def base_url(self) -> str:
        """The OpenAI base URL clients should use (`http://host:port/v1`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"
