"""Entry point of the `dspark` console script."""

from __future__ import annotations

import argparse
import sys

import engine  # noqa: F401  (loads the fast BLAS before anything imports mlx.core)
from dspark_cli import bench, doctor, eval_drafter, generate, prepare, serve, train


def build_parser() -> argparse.ArgumentParser:
    """The full `dspark` argument parser, with one subparser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="dspark", description="Local OpenAI-compatible server with lossless DSpark speculative decoding."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (generate, serve, bench, doctor, prepare, train, eval_drafter):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` and run the chosen subcommand; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
