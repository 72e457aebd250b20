"""`dspark prepare`: obtain and convert the embedded default model (idempotent)."""

from __future__ import annotations

from dspark_cli.progress import stderr_progress


def add_parser(sub) -> None:
    p = sub.add_parser("prepare", help="download (offline-capable) and convert the default model once")
    p.add_argument("--precision", choices=["auto", "float32", "stored"], default="auto",
                   help="which conversion: auto is the one `dspark serve` loads here (see its --precision)")
    p.set_defaults(run=run)


def run(args) -> int:
    from engine.loading.default_model import ensure_default_model
    from engine.loading.target import resolve_precision

    path = ensure_default_model(stderr_progress, resolve_precision(args.precision))
    print(path)
    return 0
