"""The one way headhunt writes a file: into a hidden temporary next to it, made durable, then
renamed over it, so a reader (or a resumed run) sees the old file or the new one, never half of
one; and the one way it appends a record durably.

:func:`write_file` picks the format by the name's suffix (``.json``, ``.jsonl``, ``.csv``,
``.tsv``, ``.parquet``, ``.html``, ``.safetensors``, ``.png``); :func:`write_atomic` takes any
writer (a folder too). A core module: every layer may use it (the run engine's
``RunContext.write`` does, for every file a method writes).

Fault injection for the crash tests: ``HEADHUNT_KILL_AT_WRITE=N`` makes this process leave half
of its N-th durable write (an appended record or a file's temporary) on disk, then kill itself
with SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from headhunt.errors import HeadhuntError

_KILL_AT_WRITE = int(os.environ.get("HEADHUNT_KILL_AT_WRITE", "0") or 0)
_writes = 0


def temporary(path: Path) -> Path:
    """Where ``path`` is written before its rename: hidden (never listed as a run's file) and
    ending in ``.tmp`` (a resumed run deletes it)."""
    return path.with_name(f".{path.name}.tmp")


def write_atomic(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` fills a temporary file (or folder) next to ``path``; it is made durable
    and renamed over ``path``. A writer that fails leaves nothing behind."""
    path = Path(path)
    tmp = temporary(path)
    _remove(tmp)
    try:
        write(tmp)
        _make_durable(tmp)
        if tmp.is_dir() and path.is_dir():
            shutil.rmtree(path)  # a folder cannot be renamed over a full one
        os.replace(tmp, path)
    except BaseException as e:
        _remove(tmp)  # a full disk leaves no half-written temporary behind
        if isinstance(e, OSError):
            raise write_error(path, e) from None
        raise
    return path


def append_durably(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` (whole lines) to ``path`` and make it durable before returning."""
    global _writes
    try:
        with open(path, "a") as f:
            _writes += 1
            if _writes == _KILL_AT_WRITE:
                f.write(text[: len(text) // 2])
                _sync(f)
                _kill()
            f.write(text)
            _sync(f)
    except OSError as e:  # a cut line is dropped when the run resumes
        raise write_error(Path(path), e) from None


def write_error(path: str | os.PathLike, e: OSError) -> HeadhuntError:
    """The one-line error of a failed write, naming the file (a full disk says so)."""
    return HeadhuntError(f"cannot write {path}: {e.strerror or e}")


def write_file(path: str | os.PathLike, obj: Any, **options: Any) -> Path:
    """Write ``obj`` atomically in the format ``path``'s suffix names.

    ``.json``: any JSON-able object (numpy arrays and paths too; ``indent`` default 2, ``end``
    default a newline). ``.jsonl``: an iterable of records, one a line. ``.csv``: a DataFrame
    (``to_csv`` options; no index). ``.tsv``: a 2-D array (``fmt`` default ``%.6f``) or a
    DataFrame. ``.parquet``: a DataFrame or a :class:`~headhunt.scores.HeadScores`.
    ``.html``: a plotly figure (plotly.js inlined: the file opens offline) or a string.
    ``.safetensors``: a dict of torch tensors or of numpy arrays (``metadata``). ``.png``: a
    plotly figure (through kaleido) or bytes. A string is written as it is, whatever the suffix.
    """
    path = Path(path)
    if isinstance(obj, str):
        return write_atomic(path, lambda tmp: tmp.write_text(obj))
    writer = _WRITERS.get(path.suffix)
    if writer is None:
        raise HeadhuntError(
            f"no writer for {path.name}: name a file ending in {', '.join(sorted(_WRITERS))}"
        )
    return write_atomic(path, lambda tmp: writer(tmp, obj, **options))


def json_text(obj: Any, indent: int | None = 2, end: str = "\n") -> str:
    """``obj`` as JSON text, numpy values and paths included."""
    return json.dumps(obj, indent=indent, default=json_default) + end


def json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _json(tmp: Path, obj: Any, indent: int | None = 2, end: str = "\n") -> None:
    tmp.write_text(json_text(obj, indent, end))


def _jsonl(tmp: Path, records: Iterable[Any]) -> None:
    tmp.write_text("".join(json.dumps(r, default=json_default) + "\n" for r in records))


def _frame(obj: Any):
    return obj.df if hasattr(obj, "df") and hasattr(obj, "matrix") else obj  # HeadScores


def _csv(tmp: Path, frame, **options: Any) -> None:
    _frame(frame).to_csv(tmp, **{"index": False, **options})


def _tsv(tmp: Path, obj, fmt: str = "%.6f") -> None:
    import numpy as np

    if isinstance(obj, np.ndarray):
        np.savetxt(tmp, obj, delimiter="\t", fmt=fmt)
    else:
        _frame(obj).to_csv(tmp, sep="\t", index=False)


def _parquet(tmp: Path, frame) -> None:
    _frame(frame).to_parquet(tmp, index=False)


def _html(tmp: Path, fig) -> None:
    fig.write_html(tmp, include_plotlyjs=True, full_html=True)


def _safetensors(tmp: Path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
    import numpy as np

    if all(isinstance(v, np.ndarray) for v in tensors.values()):
        from safetensors.numpy import save_file
    else:
        from safetensors.torch import save_file
    save_file(tensors, str(tmp), metadata=metadata)


def _png(tmp: Path, fig) -> None:
    if isinstance(fig, bytes):
        tmp.write_bytes(fig)
    else:
        fig.write_image(str(tmp), format="png")


_WRITERS: dict[str, Callable[..., None]] = {
    ".json": _json,
    ".jsonl": _jsonl,
    ".csv": _csv,
    ".tsv": _tsv,
    ".parquet": _parquet,
    ".html": _html,
    ".safetensors": _safetensors,
    ".png": _png,
}


def _make_durable(tmp: Path) -> None:
    """fsync the temporary (every file of a folder); the N-th such write of a process is cut
    in half and the process killed when fault injection asks for it."""
    global _writes
    _writes += 1
    files = sorted(p for p in tmp.rglob("*") if p.is_file()) if tmp.is_dir() else [tmp]
    for i, file in enumerate(files):
        with open(file, "r+b") as f:
            if _writes == _KILL_AT_WRITE and i == len(files) // 2:
                f.truncate(file.stat().st_size // 2)
                _sync(f)
                _kill()
            _sync(f)


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


def _kill() -> None:
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
