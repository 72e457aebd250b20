"""`dspark prepare`: obtain and convert the embedded default model (idempotent)."""

from __future__ import annotations

from dspark_cli.progress import stderr_progress


def add_parser(sub) -> None:
    p = sub.add_parser("prepare", help="download (offline-capable) and convert the default model once")
    p.set_defaults(run=run)


def run(args) -> int:
    from engine.loading.default_model import ensure_default_model

    path = ensure_default_model(stderr_progress)
    print(path)
    return 0
