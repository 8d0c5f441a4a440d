"""The one way headhunt reads JSON lines and files: a run's own records (a line cut by a crash ends them)
and a user's input files (a bad line is refused in one line naming the file and the line), and
the one texts reader (a ``.txt`` file whole, or the ``text`` of each JSONL row). A core module:
every layer may use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from headhunt.errors import HeadhuntError


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a run's JSONL file, [] when it is gone; a line cut by a crash mid-write
    ends the list (everything before it is intact)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def read_json(path: str | os.PathLike, missing: str) -> Any:
    """A JSON file a run or a store keeps (its manifest, its meta).

    Raises:
        HeadhuntError: ``missing`` when the file is not there; ``{path} is corrupt: ...`` when
            it is not JSON.
    """
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise HeadhuntError(missing) from None
    except json.JSONDecodeError as e:
        raise HeadhuntError(f"{path} is corrupt: {e}") from None


def read_rows(
    path: str | os.PathLike, what: str = "", where: str = "{name} line {n}"
) -> list[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a user's JSONL file.

    Raises:
        HeadhuntError: the file cannot be read (``cannot read {what}{path}``), or a line is not
            JSON (``{where}: not valid JSON``; ``where`` names the line as the caller's other
            messages do: fields ``name``, ``path``, ``n``).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise HeadhuntError(f"cannot read {what}{path}: {e}") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            line = where.format(name=path.name, path=path, n=n)
            raise HeadhuntError(f"{line}: not valid JSON ({e.msg})") from None
    return rows


def read_texts(path: str | os.PathLike) -> list[str]:
    """Texts from a file: the ``text`` of each line of a ``.jsonl`` file, else the whole file.

    Raises:
        HeadhuntError: no such file, unreadable, empty, a JSONL line without a non-empty string
            ``text``, or no texts.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise HeadhuntError(f"cannot read texts: no texts file at {path}")
    if path.suffix == ".jsonl":
        texts = []
        for n, row in read_rows(path, "texts "):
            text = row.get("text") if isinstance(row, dict) else None
            if not (isinstance(text, str) and text.strip()):
                raise HeadhuntError(f"{path.name} line {n}: needs a non-empty string 'text'")
            texts.append(text)
    else:
        try:
            texts = [path.read_text(encoding="utf-8")]
        except (OSError, UnicodeDecodeError) as e:
            raise HeadhuntError(f"cannot read texts {path}: {e}") from None
    if not any(t.strip() for t in texts):
        raise HeadhuntError(f"texts file {path} is empty")
    return texts
