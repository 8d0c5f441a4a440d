"""Run directories: the one interchange format between analyses, the CLI, the app and notebooks.

A run directory holds ``manifest.json`` (model, method, parameters, versions, timings),
``scores.parquet`` (a tidy :class:`~headhunt.heads.scores.HeadScores` table) and each method's
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

from headhunt.errors import HeadhuntError

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
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=_json_default)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


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
        """Prepare ``out`` for a run of ``method``.

        Raises:
            HeadhuntError: ``out`` exists and neither ``resume`` nor ``force`` is set; a
                resumed run had other parameters; the directory cannot be written.
        """
        out = Path(out).expanduser().resolve()
        work = out.with_name(out.name + ".partial")
        if out.exists() and not force:
            if not resume:
                raise HeadhuntError(
                    f"{out} exists; pass --resume to reuse it or --force to replace it"
                )
            if (out / MANIFEST).is_file():
                manifest = json.loads((out / MANIFEST).read_text())
                _check_same(manifest.get("parameters"), parameters, out)
                return cls(out=out, work=out, method=method, complete=True)
            raise HeadhuntError(
                f"{out} exists but holds no finished run; pass --force to replace it"
            )
        if work.exists() and not resume:
            if not force:
                raise HeadhuntError(
                    f"{work} holds an unfinished run; pass --resume to continue it or --force to start over"
                )
            shutil.rmtree(work)
        created = not work.exists()
        try:
            work.mkdir(parents=True, exist_ok=True)
            probe = work / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise HeadhuntError(
                f"cannot write the run directory {work}: {e.strerror or e}"
            ) from None
        state = work / "parameters.json"
        if state.is_file():
            _check_same(json.loads(state.read_text()), parameters, work)
        elif parameters is not None:
            write_json_atomic(state, parameters)
        run = cls(out=out, work=work, method=method, force=force)
        if created:
            _STARTED.append(run)
        return run

    def discard_if_empty(self) -> None:
        """Remove a work folder this process created if no work was saved in it yet (a run that
        failed on bad input leaves nothing behind)."""
        if self.work == self.out or not self.work.is_dir():
            return
        if {p.name for p in self.work.iterdir()} <= {"parameters.json"}:
            shutil.rmtree(self.work, ignore_errors=True)

    def path(self, name: str) -> Path:
        """Where to write the file ``name`` of this run."""
        return self.work / name

    def append_record(self, record: dict[str, Any], name: str = "records.jsonl") -> None:
        """Append one finished unit of work (a trial, a text) durably, for resuming."""
        with open(self.work / name, "a") as f:
            f.write(json.dumps(record, default=_json_default) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def records(self, name: str = "records.jsonl") -> list[dict[str, Any]]:
        """Records appended so far (by this or an interrupted earlier process); ``name`` may be
        a glob such as ``"trials*.jsonl"`` to read every shard of a distributed run."""
        out = []
        for path in sorted(self.work.glob(name)):
            for line in path.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line cut by a crash mid-write: everything before it is intact
        return out

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
            old = self.out.with_name(self.out.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.out, old)
            os.replace(self.work, self.out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.work, self.out)
        return self.out


_STARTED: list[RunDir] = []


def discard_unstarted_runs() -> None:
    """Called by the CLI after an error: drop the empty work folders this process created."""
    while _STARTED:
        _STARTED.pop().discard_if_empty()


def _check_same(old: Any, new: Any, where: Path) -> None:
    if old is None or new is None:
        return
    old, new = (
        json.loads(json.dumps(old, default=_json_default)),
        json.loads(json.dumps(new, default=_json_default)),
    )
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k != "resume")
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
        """The run's :class:`~headhunt.heads.scores.HeadScores`."""
        from headhunt.heads.scores import HeadScores

        return HeadScores.read_parquet(self.path / SCORES)

    def json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())


def load_run(path: str | os.PathLike) -> Run:
    """Read a finished run directory.

    Raises:
        HeadhuntError: the folder is missing, unfinished, or its manifest is corrupt.
    """
    path = Path(path).expanduser()
    if not path.is_dir():
        raise HeadhuntError(f"no run directory at {path}")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise HeadhuntError(f"{path} is not a finished run (no {MANIFEST})") from None
    except json.JSONDecodeError as e:
        raise HeadhuntError(f"{path / MANIFEST} is corrupt: {e}") from None
    if not isinstance(manifest, dict) or "method" not in manifest:
        raise HeadhuntError(f"{path / MANIFEST} is not a headhunt manifest")
    return Run(path=path, manifest=manifest)


def find_runs(root: str | os.PathLike) -> Iterator[Path]:
    """Run directories (folders with a manifest) at or below ``root``, newest first."""
    root = Path(root).expanduser()
    found: Iterable[Path] = (p.parent for p in root.rglob(MANIFEST) if ".partial" not in str(p))
    yield from sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
