"""Options and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from headhunt.methods.base import require  # noqa: F401  (the generated subcommand uses it)

DEFAULT_MODEL = "smollm2-135m"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows a value's default once: a flag that takes no value (``--resume``,
    ``--no-bos``) says what giving it does, not the default of what it sets; an option whose
    default is None (nothing given) or whose help already says what the default is or that
    it is required gets no "(default: ...)" appended."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.nargs == 0 or action.default is None or re.search(r"default|required", text):
            return action.help
        return super()._get_help_string(action)


def add_command(
    sub, name: str, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=help, description=description or help, formatter_class=HelpFormatter
    )


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model, --device, --dtype, --seed, --trust-remote-code."""
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="registry name, local HF folder, .gguf file, or HF id in the local cache",
    )
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument(
        "--device-map",
        default=None,
        help="spread the layers over devices with accelerate (for models larger than one "
        "GPU): auto (balanced over the visible GPUs), balanced, sequential, or a JSON "
        'module -> device map such as \'{"model.layers.0": "cuda:0", ...}\'; overrides --device',
    )
    g.add_argument(
        "--dtype",
        default="auto",
        help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16",
    )
    g.add_argument(
        "--no-cache",
        action="store_true",
        help="a .gguf model: keep nothing in $HEADHUNT_CACHE (its config, tokenizer and "
        "tensor names are parsed again at every load; weights are never copied)",
    )
    g.add_argument("--seed", type=seed, default=0, help="random seed (0 to 2**32 - 1)")
    g.add_argument(
        "--trust-remote-code", action="store_true", help="allow a model folder's own code to run"
    )


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    """--nproc (data parallel: one model replica per process, one GPU each)."""
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes (one model replica each, one GPU each when there are GPUs; work "
        "sharded by rank, gathered by rank 0 into one run directory); also works under torchrun",
    )


def add_out_args(p: argparse.ArgumentParser, default: str) -> None:
    """--out, --resume, --force."""
    g = p.add_argument_group("output")
    g.add_argument("--out", default=default, help="run directory to write")
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run (or reprint a finished one)",
    )
    g.add_argument("--force", action="store_true", help="replace an existing run directory")


def finite_float(text: str) -> float:
    """argparse type for a float that must be a number (``nan`` and ``inf`` are refused: a NaN
    parameter would make every comparison, and so every resume, fail)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def seed(text: str) -> int:
    """argparse type for a seed: an integer that numpy, torch and ``random`` all take."""
    from headhunt.config import SEED_MAX

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside 0..{SEED_MAX}")
    return value


def comma_list(kind: Callable[[str], Any], name: str = "value") -> Callable[[str], list]:
    """argparse type for comma-separated lists: ``--lengths 500,1000,2000``."""

    kind = finite_float if kind is float else kind

    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {name}s")
        try:
            return [kind(t) for t in items]
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma-separated list of {name}s"
            ) from None

    return parse
