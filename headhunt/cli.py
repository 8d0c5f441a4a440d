"""The `headhunt` command line: one subcommand per method.

Every method in the registry (``headhunt.methods.METHODS``) gets its subcommand from its
config's fields (``headhunt/commands/method.py``); the commands that make no run
(:data:`OTHER_COMMANDS`) live in ``headhunt/commands/<name>.py`` with
``add_parser(subparsers)`` (which sets ``func``). Heavy imports (torch, transformers) wait until
a command runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from headhunt import __version__
from headhunt.errors import HeadhuntError
from headhunt.rundir import discard_unstarted_runs, open_runs, release_runs

# The commands that are not methods (each a module of headhunt/commands); the methods' come
# from the registry.
OTHER_COMMANDS = ("export", "app", "cache")


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
    from headhunt import methods
    from headhunt.commands import method

    for name in methods.METHODS:  # made by the run engine from the method's config
        method.add_parser(sub, methods.get(name))
    for name in OTHER_COMMANDS:
        importlib.import_module(f"headhunt.commands.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(
        sys.argv[1:] if argv is None else argv
    )  # for commands that relaunch themselves
    debug = args.debug or bool(os.environ.get("HEADHUNT_DEBUG"))
    mark = open_runs()  # runs opened before this command (in a notebook) are not its to touch
    try:
        code = _run(args, debug, mark)
    except BaseException:
        discard_unstarted_runs(mark)
        raise
    if code:
        discard_unstarted_runs(mark)  # a failed run leaves no empty run folder behind
    release_runs(mark)
    return code


def _say(line: str) -> None:
    """Print an error line; a worker rank of a group leaves it to its launcher (one line per
    failed group, not one per rank)."""
    if os.environ.get("HEADHUNT_RANK_ERRORS") and os.environ.get("RANK", "0") != "0":
        from headhunt.distributed import report_rank_error

        report_rank_error(line)
    else:
        print(line, file=sys.stderr)


def _run(args: argparse.Namespace, debug: bool, mark: int = 0) -> int:
    from headhunt.rundir import saved_work, write_error

    try:
        return int(args.func(args) or 0)
    except HeadhuntError as e:
        _say(f"headhunt {args.command}: error: {e}")
        return 2
    except KeyboardInterrupt:
        said = (
            "finished work is kept, rerun with --resume"
            if saved_work(mark)
            else "nothing was finished yet, nothing is kept"
        )
        print(f"headhunt {args.command}: interrupted; {said}", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            # A write outside the run helpers (a library's own file writer) hit a full disk.
            _say(f"headhunt {args.command}: error: {write_error(e.filename or 'a file', e)}")
            return 2
        _say(
            f"headhunt {args.command}: unexpected error: {type(e).__name__}: {e} "
            "(rerun with --debug for details)"
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
