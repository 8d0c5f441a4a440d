"""The subcommand of a registered method, made from its config's fields (one flag per field,
help and bounds from the field's metadata) plus the shared model, output and --nproc options."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from headhunt.commands.common import (
    add_command,
    add_model_args,
    add_out_args,
    add_parallel_args,
    comma_list,
    finite_float,
    require,
)
from headhunt.methods.base import Method, flag_name, is_list, item_type


def add_parser(sub, method: Method) -> None:
    p = add_command(sub, method.name, method.help, method.description)
    add_model_args(p)
    add_out_args(p, f"runs/{method.name}")
    g = p.add_argument_group(method.name)
    for f in fields(method.Config):
        if not f.metadata.get("cli", True):
            continue
        default = f.default_factory() if f.default is MISSING else f.default
        kind = item_type(f)
        help = f.metadata["help"]
        if f.metadata.get("choices"):
            help += f" ({', '.join(map(str, f.metadata['choices']))})"
        if kind is bool:
            action = "store_false" if default else "store_true"
            g.add_argument(flag_name(f), dest=f.name, action=action, help=help)
            continue
        if is_list(f):  # given comma-separated; argparse parses a string default too
            parse = comma_list(kind, f.name.rstrip("s").replace("_", " "))
            default = None if default is None else ",".join(map(str, default))
        else:
            parse = finite_float if kind is float else kind
        g.add_argument(flag_name(f), dest=f.name, type=parse, default=default, help=help)
    g.add_argument("--top", type=int, default=method.top, help="rows of the printed tables")
    if method.units:
        add_parallel_args(p)
    p.set_defaults(func=lambda args: run(method, args))


def config_from_args(method: Method, args: argparse.Namespace):
    """The method's config from the parsed flags (``seed`` from the shared ``--seed``)."""
    values = {}
    for f in fields(method.Config):
        if f.name == "seed":
            values["seed"] = args.seed
        elif f.metadata.get("cli", True):
            values[f.name] = getattr(args, f.name)
    return method.Config(**values)


def run(method: Method, args: argparse.Namespace) -> int:
    from headhunt import distributed
    from headhunt.engine import ModelSpec, execute

    config = config_from_args(method, args)
    method.prepare(config)  # bad options and files fail before processes start or a model loads
    require(args.top >= 0, "--top must not be negative")
    code = distributed.launch_if_asked(
        getattr(args, "nproc", 1), args.argv, device=args.device, device_map=args.device_map
    )
    if code is not None:
        return code
    spec = ModelSpec(args.model, args.device, args.dtype, args.device_map, args.trust_remote_code)
    spec.cache = not args.no_cache
    execute(
        method,
        config,
        out=args.out,
        spec=spec,
        seed=args.seed,
        resume=args.resume,
        force=args.force,
        top=args.top,
    )
    return 0
