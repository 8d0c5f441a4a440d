"""One config per method: the class the top-level API exports is the one the method runs with,
each field is declared once, and the config machinery refuses what would make a run wrong or
absurd (a value given twice, a size past its limit, a bad seed) in one line."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

import headhunt as hh
from headhunt.cli import build_parser, main
from headhunt.config import MethodConfig, default_of, option
from headhunt.methods import METHODS, get


def declarations(configs: list[type]) -> dict[str, set[tuple[str, str]]]:
    """Field name -> the distinct declarations of it in ``configs`` and their bases, each as
    (class that wrote it, its help). An inherited field is its base's declaration, and
    :func:`default_of` keeps the base's; a field written again in a subclass or in another
    config with the same help is a copy."""
    found: dict[str, set[tuple[str, str]]] = {}
    for config in configs:
        for cls in config.__mro__:
            own = cls.__dict__.get("__annotations__", {})
            for f in fields(cls) if "__dataclass_fields__" in cls.__dict__ else []:
                if f.name not in own:
                    continue  # inherited: counted at the class that declares it
                origin = f.metadata.get("declared_by") or f"{cls.__module__}.{cls.__qualname__}"
                found.setdefault(f.name, set()).add((origin, f.metadata.get("help", "")))
    return found


def copies(configs: list[type]) -> list[str]:
    """Fields declared twice: by two classes of which one derives from the other (a subclass
    that redeclares instead of inheriting), or by two configs with the same help text."""
    out = []
    for name, decl in sorted(declarations(configs).items()):
        helps = [h for _, h in decl]
        origins = {o for o, _ in decl}
        if len(origins) > 1 and (len(set(helps)) < len(helps) or _related(origins, configs)):
            out.append(f"{name}: {sorted(origins)}")
    return out


def _related(origins: set[str], configs: list[type]) -> bool:
    for config in configs:
        names = {f"{c.__module__}.{c.__qualname__}" for c in config.__mro__}
        if len(origins & names) > 1:
            return True
    return False


def registry_configs() -> list[type]:
    return [get(name).Config for name in METHODS]


def test_no_field_is_declared_twice_across_the_method_and_library_configs():
    assert copies(registry_configs() + library_configs()) == []


def test_the_duplicate_check_sees_a_planted_copy():
    retrieval = get("retrieval").Config

    @dataclass
    class Copied(MethodConfig):  # another method's field, written out again
        lengths: list[int] = option([500], "prompt lengths in tokens (frame, haystack, needle "
                                    "and question together)")  # fmt: skip

    @dataclass
    class Redeclared(retrieval):  # a subclass that redeclares instead of inheriting
        lengths: list[int] = option([100], "other lengths")

    @dataclass
    class Redefaulted(retrieval):  # another default, the one declaration: allowed
        lengths: list[int] = default_of(retrieval, "lengths", [1000])

    helps = {h for _, h in declarations([retrieval])["lengths"]}
    assert Copied.__dataclass_fields__["lengths"].metadata["help"] in helps  # a true copy
    (owner,) = [c for c in retrieval.__mro__ if "lengths" in c.__dict__.get("__annotations__", {})]
    assert copies([retrieval, Copied]) == [f"lengths: {sorted([_name(owner), _name(Copied)])}"]
    assert copies([retrieval, Redeclared]) == [
        f"lengths: {sorted([_name(owner), _name(Redeclared)])}"
    ]
    assert copies([retrieval, Redefaulted]) == []
    assert Redefaulted().lengths == [1000] and retrieval().lengths != [1000]


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@pytest.mark.parametrize("name", sorted(METHODS))
def test_the_top_level_api_exports_every_methods_config(name):
    config = get(name).Config
    assert getattr(hh, config.__name__) is config
    assert config.__name__ in hh.__all__


@pytest.mark.parametrize("name", sorted(METHODS))
def test_headhunt_run_takes_the_exported_config(name, tmp_path):
    """The engine accepts the exported class (a wrong class is refused by name); the run then
    stops at the first thing the method needs (a model that is not there, a required option),
    never at the config's type."""
    exported = getattr(hh, get(name).Config.__name__)
    with pytest.raises(hh.HeadhuntError) as refused:
        hh.run(name, exported(), model_spec=str(tmp_path / "no-model"), out=tmp_path / "r")
    assert "takes a" not in str(refused.value)

    @dataclass
    class Other(MethodConfig):
        pass

    with pytest.raises(hh.HeadhuntError, match=f"{name} takes a {exported.__name__}"):
        hh.run(name, Other(), model_spec="x", out=tmp_path / "r")


# Issue 29: config-level defects, each refused in one line before any work starts.
REFUSED = [
    (["retrieval", "--lengths", "200,200"], "--lengths lists 200 twice"),
    (["retrieval", "--needles", "passkey,passkey"], "--needles lists 'passkey' twice"),
    (["retrieval", "--depths", "50,50.0"], "--depths lists 50.0 twice"),
    (["retrieval", "--repeats", "100000000"], "--repeats must be at most 100000"),
    (["retrieval", "--repeats", "50000", "--lengths", "100,200"], "make 1500000 trials"),
    (["retrieval", "--lengths", "99999999"], "--lengths must be at most"),
    (["sinks", "--n-texts", "100000000"], "--n-texts must be at most"),
    (["retrieval", "--seed", "-1"], "argument --seed: -1 is outside 0..4294967295"),
    (["sinks", "--seed", "2**32"], "argument --seed: '2**32' is not an integer"),
]


@pytest.mark.parametrize(("argv", "message"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_bad_config_values_are_refused_in_one_line(argv, message, tmp_path, capsys):
    try:
        code = main([*argv, "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "r")])
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "unexpected error" not in err
    assert not (tmp_path / "r").exists() and not (tmp_path / "r.partial").exists()


def test_a_huge_haystack_is_refused_before_it_is_read(tmp_path, capsys):
    big = tmp_path / "hay.txt"
    with open(big, "wb") as f:  # sparse: 9 MiB on paper, nothing on disk
        f.truncate(9 * 2**20)
    argv = ["retrieval", "--haystack", str(big), "--model", str(tmp_path / "no-model")]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "is 9.0 MiB; at most 8 MiB" in err and len(err.strip().splitlines()) == 1


def test_the_library_refuses_a_repeated_entry_too():
    with pytest.raises(hh.HeadhuntError, match="--needles lists 'city' twice"):
        hh.RetrievalConfig(needles=["city", "passkey", "city"])


def _flag_help(command: str, flag: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    (action,) = [a for a in sub._actions if flag in a.option_strings]
    return sub._get_formatter()._format_action(action)


def test_help_of_a_no_flag_says_what_it_does_not_a_default():
    seen = 0
    for name in METHODS:
        for f in fields(get(name).Config):
            flag = f.metadata.get("flag") or ""
            if not flag.startswith("--no-"):
                continue
            text = _flag_help(name, flag)
            assert "default" not in text and f.metadata["help"].split()[0] in text, text
            seen += 1
    assert seen >= 4  # --no-bos, --no-truth, --no-eap, --no-png, ...
    assert "(default: 24)" in _flag_help("retrieval", "--max-new-tokens")


def test_help_states_each_default_once_and_never_none_or_a_bool():
    """Issue 29: "(default: None)" after "(default: bundled essays)" or "(required)", and
    "(default: False)" on a flag, read wrong; every command's every option is checked."""
    commands = build_parser()._subparsers._group_actions[0].choices
    checked = 0
    for name, sub in commands.items():
        for action in sub._actions:
            if not action.option_strings or action.help is None:
                continue
            text = " ".join(sub._get_formatter()._format_action(action).split())
            for wrong in ("(default: None)", "(default: False)", "(default: True)"):
                assert wrong not in text, f"{name}: {text}"
            assert text.count("default") <= 1, f"{name}: {text}"
            checked += 1
    assert checked > 200
    assert "(default: bundled essays)" in _flag_help("retrieval", "--haystack")
    assert "required" in _flag_help("ablate", "--scores")


def origins(config: type) -> dict[str, str]:
    """Field name -> the class that declares it (as :func:`declarations` counts: an inherited
    field, or one given another default by ``default_of``, is its base's declaration)."""
    out = {}
    for f in fields(config):
        owner = [c for c in config.__mro__ if f.name in c.__dict__.get("__annotations__", {})][0]
        out[f.name] = f.metadata.get("declared_by") or _name(owner)
    return out


def library_configs() -> list[type]:
    """The config dataclasses of the analyzer and capture layers (``*Config`` classes of
    ``headhunt.heads``, ``headhunt.sae`` and ``headhunt.probes``; method configs among them)."""
    import importlib
    import pkgutil

    import headhunt.heads
    import headhunt.probes
    import headhunt.sae

    found = []
    for package in (headhunt.heads, headhunt.sae, headhunt.probes):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            found += [
                obj
                for name, obj in vars(module).items()
                if isinstance(obj, type)
                and name.endswith("Config")
                and obj.__module__ == module.__name__
                and "__dataclass_fields__" in obj.__dict__
            ]
    return found


def library_pairs() -> dict[str, str]:
    """Library configs that declare four or more of one method config's fields again (a field
    the two inherit from one class is declared once) -> the method."""
    method_fields = {n: origins(get(n).Config) for n in METHODS}
    found = {}
    for config in library_configs():
        own = origins(config)
        for method, theirs in method_fields.items():
            again = {n for n in own.keys() & theirs.keys() - {"seed"} if own[n] != theirs[n]}
            if len(again) >= 4:
                found[f"{config.__module__}.{config.__name__}"] = method
    return found


def test_no_library_config_declares_a_method_configs_fields_again():
    """The library's configs (SAEConfig, PruneEvalConfig, ProbeConfig, CaptureConfig, ...)
    take a method's fields from the class that declares them, or are the method's config."""
    assert library_pairs() == {}


def test_the_pair_check_sees_a_planted_library_config(monkeypatch):
    import headhunt.heads.inputs.needles as needles

    @dataclass
    class PlantedConfig:  # sinks' analysis settings, declared again in the library
        tau: float = 0.1
        min_queries: int = 32
        min_query_share: float = 0.1
        eps: float = 0.3

    sinks = get("sinks").Config

    @dataclass
    class PlantedOptionConfig(MethodConfig):  # the same, written as a method-style config
        tau: float = option(0.1, "attention share that makes a key a sink")
        min_queries: int = option(32, "queries")
        min_query_share: float = option(0.1, "share")
        eps: float = option(0.3, "eps")

    @dataclass
    class InheritedConfig(sinks):  # inherits them (one declaration), another default: allowed
        tau: float = default_of(sinks, "tau", 0.2)

    for planted in (PlantedConfig, PlantedOptionConfig, InheritedConfig):
        planted.__module__ = needles.__name__
        monkeypatch.setattr(needles, planted.__name__, planted, raising=False)
    found = library_pairs()
    assert found["headhunt.heads.inputs.needles.PlantedConfig"] == "sinks"
    assert found["headhunt.heads.inputs.needles.PlantedOptionConfig"] == "sinks"
    assert "headhunt.heads.inputs.needles.InheritedConfig" not in found
