"""The registry's methods: every config survives the trip through its CLI flags (what
``headhunt.run(..., nproc=N)`` relaunches with), and the library runs a group of processes."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields

import pytest

import headhunt as hh
from headhunt.cli import build_parser
from headhunt.commands.method import config_from_args
from headhunt.methods import METHODS, get
from headhunt.methods.base import is_list, item_type


def tweaked(config):
    """A config with every field the CLI sets moved off its default."""
    values = {}
    for f in fields(config):
        default = f.default_factory() if f.default is MISSING else f.default
        kind = item_type(f)
        lo = f.metadata.get("min")
        if not f.metadata.get("cli", True):
            value = 7 if kind is int else default
        elif kind is bool:
            value = not default
        elif is_list(f):
            value = (default or [kind(1)])[:1]
        elif kind is int:
            value = max((default or 0) + 1, lo or 0)  # within the field's bounds
        elif kind is float:
            value = round((default or 0.0) / 2 + 0.25, 4)
        elif f.metadata.get("choices"):
            value = f.metadata["choices"][-1] if default is None else default
        else:
            value = default if default is not None else "some/file.txt"
        values[f.name] = value
    return type(config)(**values)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_config_round_trips_through_its_flags(name):
    method = get(name)
    parser = build_parser()
    for config in (method.Config(), tweaked(method.Config())):
        args = parser.parse_args([name, *config.to_argv(), "--seed", str(config.seed)])
        assert config_from_args(method, args) == config
        assert method.Config.from_dict(config.to_dict()) == config


def test_two_processes_from_python(tiny_folder, tmp_path):
    texts = tmp_path / "texts.jsonl"
    words = "the secret code of the vault is blue . remember the code . "
    texts.write_text("".join(json.dumps({"text": words * k}) + "\n" for k in (4, 5, 3)))
    config = {"texts": str(texts), "min_queries": 8, "eps_tokens": 16}
    run = hh.run("sinks", config, model_spec=str(tiny_folder), out=tmp_path / "two", nproc=2)
    assert run.manifest["processes"] == 2
    one = hh.run("sinks", config, model_spec=str(tiny_folder), out=tmp_path / "one")
    for name in ("texts.jsonl", "scores.parquet", "summary.json"):
        assert (one.path / name).read_bytes() == (run.path / name).read_bytes(), name
