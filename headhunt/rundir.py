"""Run directories: the one interchange format between analyses, the CLI, the app and notebooks.

A run directory holds ``manifest.json`` (model, method, parameters, versions, timings),
``scores.parquet`` (a tidy :class:`~headhunt.scores.HeadScores` table) and each method's
own interchange files. It is built in a sibling ``<out>.partial`` folder, where a long run also
keeps its finished work, and renamed into place only when complete: a reader never sees a
half-written run, and an interrupted run resumes from the partial folder.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headhunt.atomic import append_durably, json_default, write_file
from headhunt.atomic import write_error as write_error  # the CLI names a failed write with it
from headhunt.errors import HeadhuntError
from headhunt.reading import read_json, read_records

MANIFEST = "manifest.json"
SCORES = "scores.parquet"


def package_versions() -> dict[str, str]:
    """Versions of the packages that decide the numbers in a run."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("headhunt", "torch", "transformers", "transformer-lens", "numpy", "triton"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON through a temporary file and a rename, so a reader never sees half a file."""
    write_file(path, obj)


@dataclass
class RunDir:
    """A run directory under construction.

    Use :meth:`open`; write files into :attr:`work`; call :meth:`finalize` once everything is
    written. Records appended with :meth:`append_record` survive an interruption and are
    returned by :meth:`records` when the run is resumed.

    Attributes:
        out: the final directory.
        work: where files are written until :meth:`finalize` renames it to ``out``.
        complete: True when ``out`` already held a finished run and ``--resume`` was given:
            nothing needs computing, read it with :func:`load_run`.
    """

    out: Path
    work: Path
    method: str
    force: bool = False
    complete: bool = False
    started: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat())
    _lock: Any = field(default=None, repr=False, compare=False)
    _made: list[Path] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def open(
        cls,
        out: str | os.PathLike,
        method: str,
        *,
        resume: bool = False,
        force: bool = False,
        parameters: dict[str, Any] | None = None,
    ) -> RunDir:
        """Prepare ``out`` for a run of ``method`` and lock its work folder.

        ``resume`` continues ``<out>.partial`` when there is one (also after an interrupted
        ``--force`` run over a finished one), else reprints a finished ``out``. ``force``
        replaces ``out`` and ``<out>.partial``, but only when they are run directories: it never
        deletes a folder headhunt did not write.

        Raises:
            HeadhuntError: ``out`` exists and neither ``resume`` nor ``force`` is set; ``force``
                would replace something that is not a run directory; another process is writing
                the run; a resumed run had other parameters; the directory cannot be written.
        """
        out = Path(out).expanduser().resolve()
        if not out.name:
            raise HeadhuntError(f"--out {out} is the filesystem root; choose a folder below it")
        work = out.with_name(out.name + ".partial")
        try:
            os.stat(work)  # a name the filesystem cannot hold fails here, in one line
        except FileNotFoundError:
            pass
        except OSError as e:
            raise HeadhuntError(f"cannot use --out {_short(out)}: {e.strerror or e}") from None
        if out.exists() and not _is_run_dir(out) and not _is_empty_dir(out):
            kind = "a file" if not out.is_dir() else "a folder that is not a headhunt run"
            raise HeadhuntError(
                f"{out} is {kind}; headhunt writes only new or run directories: "
                "choose another --out"
            )
        if resume and work.is_dir():
            pass  # continue the unfinished run (finalize replaces a finished `out`)
        elif out.exists() and not force:
            if not resume:
                raise HeadhuntError(
                    f"{out} exists; pass --resume to reuse it or --force to replace it"
                )
            if (out / MANIFEST).is_file():
                _check_same(_read_json(out / MANIFEST).get("parameters"), parameters, out)
                return cls(out=out, work=out, method=method, complete=True)
            raise HeadhuntError(
                f"{out} exists but holds no finished run; pass --force to replace it"
            )
        if work.exists() and not resume:
            if not force:
                raise HeadhuntError(
                    f"{work} holds an unfinished run; pass --resume to continue it or --force to start over"
                )
            if not (work.is_dir() and _is_work_dir(work)):
                raise HeadhuntError(
                    f"{work} is not an unfinished headhunt run; remove it or choose another --out"
                )
            _lock(work).close()  # refuses while another process writes it
            shutil.rmtree(work)
        made = _missing_parents(work)
        try:
            work.mkdir(parents=True, exist_ok=True)
            probe = work / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise HeadhuntError(
                f"cannot write the run directory {work}: {e.strerror or e}"
            ) from None
        lock = _lock(work)
        try:
            _repair(work)
            state = work / "parameters.json"
            if state.is_file():
                _check_same(_read_json(state), parameters, work)
            elif parameters is not None:
                write_json_atomic(state, parameters)
        except BaseException:
            lock.close()
            raise
        run = cls(out=out, work=work, method=method, force=force)
        run._lock, run._made = lock, made
        _OPEN.append(run)
        return run

    def release(self) -> None:
        """Give up the work folder's lock (done by :meth:`finalize`; the CLI calls it after a
        failed run)."""
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.close()
            self._lock = None

    def discard_if_empty(self) -> None:
        """Remove a work folder this process created if no work was saved in it yet (a run that
        failed on bad input leaves nothing behind)."""
        if self.work == self.out or not self.work.is_dir():
            return
        if not _work_files(self.work):
            shutil.rmtree(self.work, ignore_errors=True)
            for parent in getattr(self, "_made", []):  # the folders open() created, deepest first
                try:
                    parent.rmdir()
                except OSError:
                    break

    def path(self, name: str) -> Path:
        """Where to write the file ``name`` of this run."""
        return self.work / name

    def append_record(self, record: dict[str, Any], name: str = "records.jsonl") -> None:
        """Append one finished unit of work (a trial, a text) durably, for resuming."""
        append_durably(self.work / name, json.dumps(record, default=json_default) + "\n")

    def records(self, name: str = "records.jsonl") -> list[dict[str, Any]]:
        """Records appended so far (by this or an interrupted earlier process); ``name`` may be
        a glob such as ``"trials*.jsonl"`` to read every shard of a distributed run."""
        return [r for path in sorted(self.work.glob(name)) for r in read_records(path)]

    def finalize(
        self,
        *,
        model: dict[str, Any],
        parameters: dict[str, Any],
        timings: dict[str, float],
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Write the manifest and move the finished run into place."""
        manifest = {
            "method": self.method,
            "created": self.started,
            "finished": _dt.datetime.now(_dt.UTC).isoformat(),
            "model": model,
            "parameters": parameters,
            "versions": package_versions(),
            "timings": {k: round(float(v), 4) for k, v in timings.items()},
            "command": " ".join(sys.argv),
            "files": sorted(p.name for p in self.work.iterdir() if not p.name.startswith(".")),
            **(extra or {}),
        }
        manifest["files"] = sorted(set(manifest["files"]) | {MANIFEST})
        write_json_atomic(self.work / MANIFEST, manifest)
        if self.work == self.out:
            return self.out
        if self.out.exists():
            if not (_is_run_dir(self.out) or _is_empty_dir(self.out)):
                raise HeadhuntError(f"{self.out} is no longer a run directory; not replacing it")
            # The old run is renamed aside (hidden, next to it) and removed once the new one
            # is in place: a reader sees the old run or the new one, never neither for long.
            old = self.out.with_name(f".{self.out.name}.replaced")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.out, old)
            os.replace(self.work, self.out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.work, self.out)
        self.release()
        return self.out


_OPEN: list[RunDir] = []


def open_runs() -> int:
    """How many runs this process holds open (a mark for :func:`release_runs`)."""
    return len(_OPEN)


def discard_unstarted_runs(since: int = 0) -> None:
    """Called by the CLI after an error: drop the empty work folders opened since the mark
    ``since`` (and the empty parent folders made for them) and unlock the others."""
    while len(_OPEN) > since:
        run = _OPEN.pop()
        run.discard_if_empty()
        if run.work.is_dir() and run.work != run.out:
            for tmp in [*run.work.glob("*.tmp"), *run.work.glob(".*.tmp")]:
                tmp.unlink(missing_ok=True)  # a write cut by an error (a full disk)
        run.release()


def saved_work(since: int = 0) -> bool:
    """Whether a run opened since the mark ``since`` has kept any finished work (a resume
    would start from it)."""
    for run in _OPEN[since:]:
        if run.work.is_dir() and run.work != run.out and _work_files(run.work):
            return True
    return False


def release_runs(since: int = 0) -> None:
    """Unlock the runs opened since the mark ``since`` (the CLI calls it when a command ends)."""
    while len(_OPEN) > since:
        _OPEN.pop().release()


def _short(path: Path, limit: int = 80) -> str:
    """A path cut to ``limit`` characters for a one-line message."""
    text = str(path)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"


def _work_files(work: Path) -> list[str]:
    """The files of a work folder that hold finished work: not its parameters, nor the hidden
    bookkeeping (the model's identity, temporaries, the write test)."""
    return [p.name for p in work.iterdir() if p.name != "parameters.json" and p.name[0] != "."]


def _read_json(path: Path) -> Any:
    """A run's JSON file, or a one-line error that names it."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HeadhuntError(
            f"{path} is unreadable or corrupt ({e}); pass --force to start over"
        ) from None
    if not isinstance(obj, dict):
        raise HeadhuntError(f"{path} is corrupt (not a JSON object); pass --force to start over")
    return obj


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _is_run_dir(path: Path) -> bool:
    """A finished run directory: a headhunt manifest, or a manifest next to scores.parquet (a
    run whose manifest got corrupted is still one)."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return False
    if (path / SCORES).is_file():
        return True
    try:
        obj = json.loads(manifest.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(obj, dict) and "method" in obj and "parameters" in obj


def _is_work_dir(path: Path) -> bool:
    """An unfinished run: empty, or holding its parameters or records."""
    names = [p.name for p in path.iterdir()]
    return not names or "parameters.json" in names or any(n.endswith(".jsonl") for n in names)


def _missing_parents(work: Path) -> list[Path]:
    """The folders ``work.mkdir(parents=True)`` will create, deepest first."""
    made, p = [], work.parent
    while not p.exists():
        made.append(p)
        p = p.parent
    return made


class _DirLock:
    """An exclusive ``flock`` on a folder, held while this process writes the run. The kernel
    drops it when the process dies (even by kill -9), so a crashed run never stays locked."""

    def __init__(self, path: Path):
        import fcntl

        self.fd: int | None = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            self.fd = None
            raise HeadhuntError(
                f"another headhunt process is writing {path}; wait for it to finish or stop it"
            ) from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


def _lock(path: Path) -> _DirLock:
    return _DirLock(path)


def _repair(work: Path) -> None:
    """Make an interrupted run's files safe to continue: drop temporary files of writes that
    never finished, and cut every records file after its last complete record (a crash can
    leave half a line, and new records must not be appended onto it)."""
    for tmp in [*work.glob("*.tmp"), *work.glob(".*.tmp")]:
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink(missing_ok=True)
    for path in work.glob("*.jsonl"):
        data = path.read_bytes()
        keep = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                break
            keep += len(line)
        if keep < len(data):
            with open(path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())


def _check_same(old: Any, new: Any, where: Path) -> None:
    if old is None or new is None:
        return
    old, new = (
        json.loads(json.dumps(old, default=json_default)),
        json.loads(json.dumps(new, default=json_default)),
    )
    # Compared as JSON text, so a NaN parameter equals itself.
    changed = sorted(
        k
        for k in set(old) | set(new)
        if json.dumps(old.get(k), sort_keys=True) != json.dumps(new.get(k), sort_keys=True)
        and k != "resume"
    )
    if changed:
        raise HeadhuntError(
            f"{where} was made with other parameters ({', '.join(changed)}); use --force to start over"
        )


@dataclass
class Run:
    """A finished run directory, read back."""

    path: Path
    manifest: dict[str, Any]

    @property
    def method(self) -> str:
        return self.manifest.get("method", "?")

    def scores(self):
        """The run's :class:`~headhunt.scores.HeadScores`."""
        from headhunt.scores import HeadScores

        path = self.path / SCORES
        if not path.is_file():
            raise HeadhuntError(f"{path} is missing")
        try:
            return HeadScores.read_parquet(path)
        except Exception as e:  # truncated, empty, or not a scores table
            raise HeadhuntError(f"{path} is unreadable ({type(e).__name__}: {e})") from None

    def json(self, name: str) -> Any:
        try:
            return json.loads((self.path / name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise HeadhuntError(f"{self.path / name} is missing or corrupt ({e})") from None


def load_run(path: str | os.PathLike) -> Run:
    """Read a finished run directory.

    Raises:
        HeadhuntError: the folder is missing, unfinished, or its manifest is corrupt.
    """
    path = Path(path).expanduser()
    if not path.is_dir():
        raise HeadhuntError(f"no run directory at {path}")
    manifest = read_json(path / MANIFEST, f"{path} is not a finished run (no {MANIFEST})")
    if not isinstance(manifest, dict) or "method" not in manifest:
        raise HeadhuntError(f"{path / MANIFEST} is not a headhunt manifest")
    return Run(path=path, manifest=manifest)


def find_runs(root: str | os.PathLike) -> Iterator[Path]:
    """Run directories (folders with a manifest) at or below ``root``, newest first."""
    root = Path(root).expanduser()
    found: Iterable[Path] = (p.parent for p in root.rglob(MANIFEST) if ".partial" not in str(p))
    yield from sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
