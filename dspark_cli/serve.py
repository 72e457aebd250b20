"""`dspark serve`: the OpenAI-compatible server (uvicorn, one worker, one engine thread)."""

from __future__ import annotations

import argparse
import sys

from dspark_cli.spec_args import add_spec_args
from server.settings import ENV_PREFIX

# Model and speculative flags come from spec_args (shared with generate); these are the server's.
# (flag, settings field, help); an absent flag falls back to DSPARK_<FIELD>, then the default.
_SERVER_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--host", "host", "interface to bind (default: 127.0.0.1)"),
    ("--port", "port", "TCP port (default: 8000)"),
    ("--api-key", "api_key", "require 'Authorization: Bearer KEY' on every route but /health"),
    ("--allowed-origins", "allowed_origins", "comma-separated CORS origins (default: none, CORS off)"),
    ("--allowed-hosts", "allowed_hosts", "comma-separated Host names answered besides localhost, 127.0.0.1 and [::1] "
                                         "(DNS-rebinding guard: on when bound to loopback or when given; '*': off)"),
    ("--max-queue", "max_queue", "requests allowed to wait behind the running one; more get 429 (default: 16)"),
    ("--keepalive", "keepalive_s", "seconds of stream silence before an SSE keep-alive comment (default: 15)"),
    ("--max-body-bytes", "max_body_bytes", "largest request body accepted, else 413 (default: 8388608)"),
    ("--drain-grace", "drain_grace_s", "seconds in-flight requests may still run after SIGTERM (default: 30)"),
    ("--image-max-bytes", "image_max_bytes", "largest image a request may send or link to, else 400 "
                                             "(default: 20971520)"),
    ("--image-timeout", "image_timeout_s", "seconds one image URL may take to fetch, redirects included "
                                           "(default: 10)"),
    ("--image-max-pixels", "image_max_pixels", "most pixels of one image, checked before decoding "
                                               "(default: 50000000)"),
    ("--prefix-cache-mb", "prefix_cache_mb", "MiB of finished requests' caches kept, so that a prompt sharing their "
                                             "prefix prefills only the rest; 0: off (default: memory / 8, at most 4096)"),
)
_METAVARS = {"host": "HOST", "port": "PORT", "api_key": "KEY", "allowed_origins": "ORIGINS", "allowed_hosts": "HOSTS",
             "max_queue": "N", "keepalive_s": "SECONDS", "max_body_bytes": "BYTES", "drain_grace_s": "SECONDS",
             "prefix_cache_mb": "MIB", "image_max_bytes": "BYTES", "image_timeout_s": "SECONDS",
             "image_max_pixels": "PIXELS"}
_SPEC_FIELDS = ("model", "drafter", "mode", "sampler", "max_draft", "confidence_threshold", "drafter_quantization",
               "lookup_min_ngram", "lookup_history")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible server",
                       description="Serve the OpenAI API on http://HOST:PORT/v1. Every flag can also be set with "
                                   "the environment variable named in its help.")
    add_spec_args(p)
    for flag, field, text in _SERVER_FLAGS:
        p.add_argument(flag, dest=field, default=None, metavar=_METAVARS[field],
                       help=f"{text} [env {ENV_PREFIX}{field.upper()}]")
    p.add_argument("--strict-params", dest="strict_params", action="store_true", default=None,
                   help="refuse request fields the server ignores, as OpenAI does (default: ignore and report "
                        f"them) [env {ENV_PREFIX}STRICT_PARAMS]")
    p.add_argument("--allow-private-image-urls", dest="allow_private_image_urls", action="store_true", default=None,
                   help="fetch image URLs that resolve to loopback, private or link-local addresses too (default: "
                        f"refused, the SSRF guard) [env {ENV_PREFIX}ALLOW_PRIVATE_IMAGE_URLS]")
    p.add_argument("--no-ui", dest="ui", action="store_false", default=None,
                   help="do not serve the chat page at / (the API is unchanged) "
                        f"[env {ENV_PREFIX}UI=false]")
    p.set_defaults(run=run)


def settings_from_args(args: argparse.Namespace):
    """ServerSettings from the flags given (spec flags already fell back to the environment)."""
    from server.settings import ServerSettings

    fields = _SPEC_FIELDS + tuple(field for _, field, _ in _SERVER_FLAGS) + ("strict_params", "allow_private_image_urls", "ui")
    return ServerSettings(**{f: getattr(args, f) for f in fields if getattr(args, f, None) is not None})


def run(args) -> int:
    from pydantic import ValidationError

    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        print(f"dspark serve: invalid setting: {exc}", file=sys.stderr)
        return 2
    from server.run import serve

    def announce(info) -> None:
        drafter = " ".join(part for part in (info.drafter_kind, info.drafter) if part) or "none"
        print(f"dspark-serve ready: {settings.base_url()}  (model {info.model_id}, mode {info.mode}, "
              f"drafter {drafter}, cap {info.cap})", flush=True)

    print(f"dspark-serve loading the model; {settings.base_url()} answers /health with 503 until ready",
          flush=True)
    serve(settings, on_ready=announce)
    from dspark_cli.process import exit_process

    exit_process(0)  # skip MLX's C++ static destructors, which can abort after worker-thread use
    return 0
