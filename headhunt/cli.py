"""The `headhunt` command line: one subcommand per method.

Each subcommand lives in ``headhunt/commands/<name>.py`` with ``add_parser(subparsers)``
(which sets ``func``) and keeps heavy imports (torch, transformers) inside its ``run``, so
``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from headhunt import __version__
from headhunt.errors import HeadhuntError
from headhunt.rundir import discard_unstarted_runs

COMMANDS = [
    "retrieval",
    "ablate",
    "sinks",
    "calibrate",
    "ngram",
    "mqar",
    "circuits",
    "probe",
    "prune",
    "kv_eval",
    "export",
    "app",
]


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes are reported in one line (the full usage is one --help away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="headhunt",
        description="Find and test the attention heads that make a language model recall.",
    )
    parser.add_argument("--version", action="version", version=f"headhunt {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser
    )
    for name in COMMANDS:
        module = f"headhunt.commands.{name}"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(
        sys.argv[1:] if argv is None else argv
    )  # for commands that relaunch themselves
    debug = args.debug or bool(os.environ.get("HEADHUNT_DEBUG"))
    try:
        code = _run(args, debug)
    except BaseException:
        discard_unstarted_runs()
        raise
    if code:
        discard_unstarted_runs()  # a failed run leaves no empty run folder behind
    return code


def _run(args: argparse.Namespace, debug: bool) -> int:
    try:
        return int(args.func(args) or 0)
    except HeadhuntError as e:
        print(f"headhunt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"headhunt {args.command}: interrupted; finished work is kept, rerun with --resume",
            file=sys.stderr,
        )
        return 130
    except Exception as e:
        if debug:
            raise
        print(
            f"headhunt {args.command}: unexpected error: {type(e).__name__}: {e} (rerun with --debug for details)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
