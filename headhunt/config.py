"""A method's config: one dataclass of :func:`option` fields deriving from :class:`MethodConfig`.

The same class is the library's config (``score_retrieval(model, RetrievalConfig(...))``) and
the method's (``headhunt.run("retrieval", RetrievalConfig(...))``, ``headhunt retrieval
--lengths ...``): each field is declared once, with what the command line and ``validate`` need
to know: its help, its bounds (``min``, ``max``, ``above``, ``below``: checked with a one-line
error that names the flag), its ``choices``, and for a list its item type (given on the command
line comma-separated; an item given twice is refused). A core module: it imports nothing of
headhunt but the error, so every layer's config can derive from it (the layer test).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from headhunt.errors import HeadhuntError

# numpy, torch and random take seeds in [0, 2**32).
SEED_MAX = 2**32 - 1


def option(
    default: Any,
    help: str,
    *,
    type: Any = None,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    choices: tuple | None = None,
    flag: str | None = None,
    cli: bool = True,
    distinct: bool = True,
    limit: float | None = None,
) -> Any:
    """A config field with what the CLI and ``validate`` need to know.

    Args:
        default: the default (a list default makes a comma-separated flag).
        help: one line for ``--help`` (for a ``--no-*`` flag: what giving the flag does).
        type: the value's type (the item type for lists) when the default does not tell
            (``None`` defaults).
        min, max: inclusive bounds (each item of a list); ``above``, ``below``: exclusive ones.
        limit: an inclusive upper bound on a size (trials, texts, tokens), past which a value
            is absurd: refused before any work starts rather than left to fill the memory.
        choices: the allowed values.
        flag: the flag's name when it is not the field's (``--no-bos`` for ``bos``).
        cli: False for fields the command line does not set.
        distinct: for a list, whether an item given twice is refused (True: a repeated length
            or needle would make identical trials counted twice).
    """
    meta = {"help": help, "type": type, "min": min, "max": max, "above": above, "below": below}
    meta.update({"choices": choices, "flag": flag, "cli": cli, "distinct": distinct})
    meta["limit"] = limit
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def default_of(base: type, name: str, default: Any, **meta_changes: Any) -> Any:
    """Field ``name`` of config class ``base`` (help, bounds, flag: its one declaration) with
    another default, for a config that shares the field with another method's; ``meta_changes``
    (``help``, ``type``) say what else differs, such as a default that depends on the device."""
    meta = {**base.__dataclass_fields__[name].metadata, **meta_changes}
    if "declared_by" not in meta:  # the class that wrote the field (for the duplicate test)
        (owner,) = [c for c in base.__mro__ if name in c.__dict__.get("__annotations__", {})][-1:]
        meta["declared_by"] = f"{owner.__module__}.{owner.__qualname__}"
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def fields_of(config: Any, part: type) -> dict[str, Any]:
    """The values of ``config``'s fields that config class ``part`` declares (its seed too):
    how a method config that derives from a library config hands the library its part."""
    return {f.name: _copy(getattr(config, f.name)) for f in fields(part)}


def flag_name(f) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def default_value(f) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


def is_list(f) -> bool:
    """A field given comma-separated on the command line."""
    return isinstance(default_value(f), list) or str(f.type).startswith("list[")


def item_type(f) -> Any:
    """The type of a field's value (of its items, for a list)."""
    if f.metadata.get("type") is not None:
        return f.metadata["type"]
    default = default_value(f)
    if isinstance(default, list):
        return type(default[0]) if default else str
    return type(default)


@dataclass
class MethodConfig:
    """The shared base of every method's config: the seed, dict round trip, validation (at
    construction, so a bad value fails where it is made)."""

    seed: int = option(0, "random seed", cli=False, min=0, limit=SEED_MAX)

    def __post_init__(self) -> None:
        self.validate()

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _copy(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        """The config of a dict of its fields (other keys, such as a run's ``model`` in its
        parameters, are ignored; :meth:`from_options` refuses them)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_options(cls, d: dict[str, Any]):
        """The config of a user's dict of options: a key that is no field is refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise HeadhuntError(f"{cls.__name__} has no option {unknown[0]!r}")
        return cls(**d)

    def validate(self) -> None:
        """Check every field against its metadata; raise a one-line error naming the flag."""
        for f in fields(self):
            value, name = getattr(self, f.name), flag_name(f)
            if isinstance(value, list):
                _check_distinct(f, name, value)
            for v in value if isinstance(value, list) else [value]:
                _check_value(f, name, v)

    def check(self) -> None:
        """Checks across fields (override); run after :meth:`validate`, before the model
        loads."""

    def to_argv(self) -> list[str]:
        """The command-line flags that give this config (``seed`` aside: it is ``--seed``)."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "seed" or not f.metadata.get("cli", True) or value is None:
                continue
            if isinstance(value, bool):
                if value != f.default:
                    argv.append(flag_name(f))
                continue
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            argv += [flag_name(f), text]
        return argv


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def _check_distinct(f, name: str, values: list) -> None:
    if not f.metadata.get("distinct", True):
        return
    seen = set()
    for v in values:
        key = repr(v)
        if key in seen:
            raise HeadhuntError(f"{name} lists {v!r} twice (each value once)")
        seen.add(key)


def _check_value(f, name: str, v: Any) -> None:
    meta = f.metadata
    if v is None:
        return
    if isinstance(v, float) and not math.isfinite(v):
        raise HeadhuntError(f"{name} must be a finite number, got {v}")
    if meta.get("choices") is not None and v not in meta["choices"]:
        raise HeadhuntError(f"unknown {name} {v!r} (use {', '.join(map(str, meta['choices']))})")
    lo, hi = meta.get("min"), meta.get("max")
    above, below = meta.get("above"), meta.get("below")
    if lo is not None and hi is not None and not lo <= v <= hi:
        raise HeadhuntError(f"{name} must be in [{lo}, {hi}], got {v}")
    if above is not None and below is not None and not above < v < below:
        raise HeadhuntError(f"{name} must be in ({above}, {below}), got {v}")
    if lo is not None and v < lo:
        raise HeadhuntError(f"{name} must be at least {lo}, got {v}")
    if hi is not None and v > hi:
        raise HeadhuntError(f"{name} must be at most {hi}, got {v}")
    if above is not None and v <= above:
        raise HeadhuntError(f"{name} must be above {above}, got {v}")
    if below is not None and v >= below:
        raise HeadhuntError(f"{name} must be below {below}, got {v}")
    if meta.get("limit") is not None and v > meta["limit"]:
        raise HeadhuntError(f"{name} must be at most {meta['limit']} (a size limit), got {v}")
