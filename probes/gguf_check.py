"""The load check's verdict on a GGUF model, kept in its metadata entry so that a later load of
the same model, by the same code, skips the check's forward pass.

``HookedModel`` checks every model it wraps with one forward of two three-token prompts
(``_check_calls``, ``_check_causal``): every attention layer goes through headhunt's
implementation exactly once, with head counts it can reproduce; which layers change their heads'
output before the output projection (hooks then act there) and which add a bias the model builds
to their scores; and that the model is causal. On a 1.5B model on a CPU that forward reads
every weight once: about 4 s of a load's CPU time.

Its outcome is a deterministic function of the weights, the model's code and headhunt's code,
the dtype and the device. So the first load keeps the outcome (what the check set on the
``HookedModel``) under a key made of exactly those: the GGUF's SHA-256 (which also fixes the
config and tokenizer parsed from it), the dtype, the device kind (and a GPU's name, a CPU's
instruction set as torch sees it), the versions of Python, torch, transformers, gguf-py and
numpy, and a SHA-256 over every Python file of the installed headhunt (any edit of a
development install changes it). A later load whose key matches applies the kept outcome
instead of running the forward; any other key, ``--no-cache``, a ``device_map`` load (layers
spread over several devices) and a check that refused the model (no verdict is kept) run it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# The file in a GGUF's metadata entry that holds kept verdicts, by key.
CHECKS_FILE = "checks.json"
# Verdicts kept per entry (a development install makes a new key with each edit): the newest.
_KEPT = 8
# headhunt's packages that live outside the `headhunt` folder in a development install
# (pyproject.toml's package-dir); in a wheel they are under it.
_MAPPED_PACKAGES = ("probes", "kernels", "heads", "sae", "app")


@functools.cache
def headhunt_source_digest() -> str:
    """SHA-256 over the path (relative to its package) and content of every Python file of the
    installed headhunt, in path order: a few milliseconds, once per process."""
    import headhunt

    roots = [Path(p) for p in headhunt.__path__]
    for name in _MAPPED_PACKAGES:
        spec = importlib.util.find_spec(f"headhunt.{name}")
        if spec is not None and spec.submodule_search_locations:
            roots += [Path(p) for p in spec.submodule_search_locations]
    files: dict[str, Path] = {}
    for root in roots:
        for f in root.rglob("*.py"):
            files.setdefault(str(f.resolve()), f)
    digest = hashlib.sha256()
    for resolved in sorted(files):
        digest.update(resolved.encode() + b"\0" + Path(resolved).read_bytes() + b"\0")
    return digest.hexdigest()


def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return None


def check_key_parts(file_sha256: str, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """Everything the check's outcome depends on, for a model read from a GGUF whose content
    has ``file_sha256``, cast to ``dtype`` on ``device``."""
    import numpy
    import transformers

    if device.type == "cuda":
        where = f"cuda:{torch.cuda.get_device_name(device)}"
    else:
        where = f"{device.type}:{torch.backends.cpu.get_cpu_capability()}:{platform.machine()}"
    return {
        "file_sha256": file_sha256,
        "dtype": str(dtype).removeprefix("torch."),
        "device": where,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": _version("gguf"),
        "numpy": numpy.__version__,
        "headhunt_source": headhunt_source_digest(),
    }


@dataclass(frozen=True)
class KeptCheck:
    """Where a model's check verdict is kept (``store``: the entry's checks.json) and the key
    of this load (:func:`check_key_parts`)."""

    store: Path
    parts: dict[str, Any]

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.parts, sort_keys=True).encode()).hexdigest()

    def _read(self) -> dict[str, Any]:
        try:
            kept = json.loads(self.store.read_text())
        except (OSError, ValueError):
            return {}
        return kept if isinstance(kept, dict) else {}

    def recall(self) -> dict[str, Any] | None:
        """The outcome kept under this key, or None."""
        entry = self._read().get(self.key)
        if not isinstance(entry, dict) or entry.get("parts") != self.parts:
            return None
        outcome = entry.get("outcome")
        return outcome if isinstance(outcome, dict) else None

    def keep(self, outcome: dict[str, Any]) -> None:
        """Keep ``outcome`` under this key (the newest few keys stay). Best effort: a full or
        read-only disk only costs the next load the forward."""
        if not self.store.parent.is_dir():  # no entry (--no-cache, or it could not be written)
            return
        kept = {k: v for k, v in self._read().items() if k != self.key}
        kept = dict(list(kept.items())[-(_KEPT - 1) :])
        kept[self.key] = {"parts": self.parts, "outcome": outcome}
        tmp = self.store.with_name(f"{self.store.name}.tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(kept, indent=1))
            os.replace(tmp, self.store)
        except OSError:
            tmp.unlink(missing_ok=True)


def kept_check(model, dtype: torch.dtype, device: torch.device) -> KeptCheck | None:
    """The kept-verdict slot of a model read from a GGUF with its metadata entry (set by the
    GGUF loader as ``headhunt_check_entry``), for this dtype and device; None for any other
    model."""
    entry = getattr(model, "headhunt_check_entry", None)
    source = getattr(model, "headhunt_source", None) or {}
    if entry is None or not source.get("sha256"):
        return None
    return KeptCheck(Path(entry) / CHECKS_FILE, check_key_parts(source["sha256"], dtype, device))
