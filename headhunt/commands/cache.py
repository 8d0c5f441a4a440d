"""`headhunt cache list|clear`: what headhunt keeps in $HEADHUNT_CACHE (parsed GGUF metadata,
joined registry models, file hashes)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from headhunt.commands.common import add_command

DESCRIPTION = """What headhunt keeps on disk, and how to remove it.

A .gguf model's weights are read from the file itself at every load; no copy of them is kept.
The first load of a .gguf parses its metadata (config, tokenizer, tensor names: tens of seconds)
and keeps the result in $HEADHUNT_CACHE/gguf (default ~/.cache/headhunt), one entry per file
content, a few MB (the tokenizer; about 33 MB for Gemma 3's 262k-token vocabulary); later loads
read it. A registry model shipped in chunks is joined once into $HEADHUNT_CACHE/models. `list`
shows every entry and its size, including the float32/bfloat16 weight copies older headhunt
versions wrote ("old copy": nothing reads them now); `clear` removes the GGUF entries and the old
copies, `clear --all` also the joined models and the file hashes. Pass --no-cache to a command to
keep nothing."""


def add_parser(sub) -> None:
    p = add_command(sub, "cache", "list or clear the GGUF metadata headhunt keeps", DESCRIPTION)
    p.add_argument("action", choices=["list", "clear"], help="list the entries, or remove them")
    p.add_argument(
        "--all",
        action="store_true",
        help="clear: also the joined registry models and the file-hash index",
    )
    p.set_defaults(func=run)


def entries(root: Path) -> list[tuple[str, Path]]:
    """(kind, path) of every entry under the cache root: GGUF metadata, weight copies of older
    versions, joined models, unfinished entries (a temporary folder left by a killed load)."""
    out: list[tuple[str, Path]] = []
    gguf = root / "gguf"
    if gguf.is_dir():
        for p in sorted(gguf.iterdir()):
            if not (p / ".complete").is_file():
                kind = "unfinished"
            elif any(p.glob("*.safetensors")):
                kind = "old copy"
            else:
                kind = "metadata"
            out.append((kind, p))
    models = root / "models"
    if models.is_dir():
        out += [("joined", p) for p in sorted(models.iterdir())]
    if (root / "hashes.json").is_file():
        out.append(("hashes", root / "hashes.json"))
    return out


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(args: argparse.Namespace) -> int:
    from headhunt.probes.loading import _human, cache_root

    root = cache_root()
    found = entries(root)
    if args.action == "list":
        if not found:
            print(f"{root}: empty")
            return 0
        total = 0
        for kind, path in found:
            size = size_of(path)
            total += size
            print(f"{kind:10s} {_human(size):>9s}  {path.name}")
        print(f"{'total':10s} {_human(total):>9s}  in {root}")
        return 0
    removed = 0
    for kind, path in found:
        if kind in ("joined", "hashes") and not args.all:
            continue
        removed += size_of(path)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    print(f"removed {_human(removed)} from {root}")
    return 0
