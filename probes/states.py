"""Residual-stream states at chosen positions, captured layer by layer into shards on disk.

:func:`capture_states` runs one forward pass per batch and keeps, for every chosen layer, the
output of that decoder layer (the residual stream after the layer) at each text's chosen
positions. That equals Hugging Face's ``hidden_states[L + 1]`` except for the last layer, where
HF returns the stream after the final norm and we keep it before. Optionally each head's attention output too (before ``o_proj``, so ``head_dim``
numbers per head: a linear probe on it sees everything a probe on the head's ``W_O`` image
sees). Nothing else of the forward is kept: the logits are never computed, and layers after
the last chosen one never run.

Storage: a folder with ``meta.json`` and one folder per shard of ``shard_size`` texts::

    states/meta.json
    states/shard-00000/rows.npz          item, position, token: one entry per row
    states/shard-00000/resid-L00.npy     [rows, d_model]
    states/shard-00000/heads-L00.npy     [rows, n_heads, head_dim]  (only with heads=True)

A shard is written into ``.shard-XXXXX.tmp`` and renamed when whole, so a crash leaves either a
complete shard or a ``.tmp`` folder that the next run deletes and redoes: capture resumes at
shard granularity, and memory never holds more than one shard. :class:`StateStore` reads the
shards back memory-mapped (``np.load(mmap_mode="r")``); ``layer(L)`` copies one layer of all
rows into RAM, which is what a probe needs at a time.

Rows are ordered by item, then by the item's positions in the order given.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from headhunt.atomic import write_atomic, write_file
from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.configs import STATE_DTYPES, CaptureConfig
from headhunt.probes.hooked import HookedModel
from headhunt.reading import read_json

META = "meta.json"
FORMAT = 1
STORE_DTYPES = {name: getattr(np, name) for name in STATE_DTYPES}


class TextPositions(Protocol):
    """What capture needs of a text: its token ids and the positions to read."""

    id: str
    input_ids: Sequence[int]
    positions: Sequence[int]


def resolve_positions(item: TextPositions, max_context: int | None = None) -> list[int]:
    """The item's positions as non-negative indices (``-1`` is the last token).

    Raises:
        HeadhuntError: a position outside the text, no positions, or a text longer than the
            model's context.
    """
    n = len(item.input_ids)
    if n == 0:
        raise HeadhuntError(f"text {item.id!r} has no tokens")
    if not item.positions:
        raise HeadhuntError(f"text {item.id!r} has no positions to read")
    out = []
    for p in item.positions:
        q = int(p) + n if int(p) < 0 else int(p)
        if not 0 <= q < n:
            raise HeadhuntError(
                f"text {item.id!r}: position {p} is outside its {n} tokens (0..{n - 1})"
            )
        out.append(q)
    if max_context is not None and max(out) + 1 > max_context:
        raise HeadhuntError(
            f"text {item.id!r} needs {max(out) + 1} tokens; the model's context is {max_context}"
        )
    return out


def fingerprint(items: Sequence[TextPositions]) -> str:
    """A hash of every item's ids and positions: a resumed capture must be of the same rows."""
    h = hashlib.sha256()
    for it in items:
        h.update(str(it.id).encode())
        h.update(np.asarray(it.input_ids, dtype=np.int64).tobytes())
        h.update(b"|")
        h.update(np.asarray(it.positions, dtype=np.int64).tobytes())
        h.update(b";")
    return h.hexdigest()[:24]


class _Stop(Exception):
    """Raised after the last wanted layer: the rest of the forward is not needed."""


class _Gather:
    """Where the current batch's rows go: (batch index, position) -> row of the shard buffer."""

    def __init__(self) -> None:
        self.b: Tensor | None = None
        self.pos: Tensor | None = None
        self.rows: np.ndarray | None = None


class _HeadCapture(AttentionHook):
    def __init__(self, gather: _Gather, buffers: dict[int, np.ndarray]):
        self.gather, self.buffers = gather, buffers

    def after(self, call: AttentionCall, output: Float[Tensor, "b nq hq d"]) -> Tensor:
        g = self.gather
        picked = output[g.b, g.pos]  # [rows, heads, head_dim]
        self.buffers[call.layer][g.rows] = picked.float().cpu().numpy()
        return output


@dataclass
class StateStore:
    """Captured states on disk, read back memory-mapped.

    Attributes:
        path: the states folder.
        meta: its ``meta.json`` (layers, sizes, dtype, shard list, fingerprint).
    """

    path: Path
    meta: dict[str, Any]

    @classmethod
    def open(cls, path: str | os.PathLike) -> StateStore:
        """Open a complete store.

        Raises:
            HeadhuntError: no store there, or its capture did not finish.
        """
        path = Path(path)
        meta = read_json(path / META, f"no captured states in {path} (no {META})")
        store = cls(path, meta)
        missing = [s for s in range(store.n_shards) if not store._shard(s).is_dir()]
        if missing:
            raise HeadhuntError(
                f"{path}: shards {missing[:5]} are missing; finish the capture (resume) first"
            )
        return store

    @property
    def layers(self) -> list[int]:
        return list(self.meta["layers"])

    @property
    def n_shards(self) -> int:
        return int(self.meta["n_shards"])

    @property
    def has_heads(self) -> bool:
        return bool(self.meta["heads"])

    def _shard(self, s: int) -> Path:
        return self.path / f"shard-{s:05d}"

    def _check_layer(self, layer: int) -> None:
        if layer not in self.layers:
            raise HeadhuntError(f"layer {layer} was not captured (captured: {self.layers})")

    def shard_arrays(self, layer: int, kind: str = "resid") -> list[np.ndarray]:
        """One memory-mapped array per shard: ``resid`` [rows, d_model] or ``heads``
        [rows, n_heads, head_dim]."""
        self._check_layer(layer)
        if kind == "heads" and not self.has_heads:
            raise HeadhuntError("per-head outputs were not captured (capture with heads=True)")
        return [
            np.load(self._shard(s) / f"{kind}-L{layer:02d}.npy", mmap_mode="r")
            for s in range(self.n_shards)
        ]

    def layer(self, layer: int) -> Float[np.ndarray, "rows d_model"]:
        """The residual stream after ``layer`` at every row, as one float32 array in RAM."""
        return np.concatenate(self.shard_arrays(layer), axis=0).astype(np.float32, copy=False)

    def head(self, layer: int, head: int | None = None) -> Float[np.ndarray, "rows ..."]:
        """Per-head attention outputs of ``layer``: [rows, n_heads, head_dim], or [rows,
        head_dim] for one ``head``."""
        parts = self.shard_arrays(layer, "heads")
        if head is not None:
            if not 0 <= head < self.meta["n_heads"]:
                raise HeadhuntError(f"head {head} does not exist (0..{self.meta['n_heads'] - 1})")
            parts = [p[:, head] for p in parts]
        return np.concatenate(parts, axis=0).astype(np.float32, copy=False)

    def rows(self) -> dict[str, Int[np.ndarray, " rows"]]:
        """``item`` (index into the captured items), ``position`` and ``token`` of every row."""
        out: dict[str, list[np.ndarray]] = {"item": [], "position": [], "token": []}
        for s in range(self.n_shards):
            with np.load(self._shard(s) / "rows.npz") as z:
                for k in out:
                    out[k].append(z[k])
        return {k: np.concatenate(v) for k, v in out.items()}

    @property
    def n_rows(self) -> int:
        return int(self.meta["n_rows"])


def capture_states(
    model: HookedModel,
    items: Sequence[TextPositions],
    out: str | os.PathLike,
    config: CaptureConfig | None = None,
    *,
    progress: bool = True,
) -> StateStore:
    """Capture the residual stream (and optionally per-head outputs) at each item's positions.

    Resumes: shards already in ``out`` (from an interrupted call with the same items and
    config) are kept, unfinished ones are redone.

    Args:
        model: the hooked model.
        items: texts with ``input_ids`` (BOS included if wanted) and ``positions`` (token
            indices; negative counts from the end).
        out: the states folder (created).
        config: what to capture; default all layers, residual stream only.
        progress: show a tqdm bar over texts.

    Raises:
        HeadhuntError: bad positions, an empty item list, or ``out`` holds another capture.
    """
    from tqdm.auto import tqdm

    config = config or CaptureConfig()
    layers = config.layer_list(model.n_layers)
    if not items:
        raise HeadhuntError("no texts to capture")
    positions = [resolve_positions(it, model.max_context) for it in items]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n_shards = -(-len(items) // config.shard_size)
    meta = {
        "format": FORMAT,
        "config": config.stored(),
        "layers": layers,
        "heads": config.heads,
        "d_model": model.d_model,
        "n_heads": model.n_heads,
        "head_dim": model.head_dim,
        "dtype": config.state_dtype,
        "n_items": len(items),
        "n_rows": sum(len(p) for p in positions),
        "n_shards": n_shards,
        "fingerprint": fingerprint(items),
        "model": model.name,
    }
    if (out / META).is_file():
        old = json.loads((out / META).read_text())
        if old != json.loads(json.dumps(meta)):
            raise HeadhuntError(
                f"{out} holds states of another capture (other texts, model or options); "
                "use a fresh folder"
            )
    else:  # a temporary file and a rename: a reader never sees half of it
        write_file(out / META, meta)
    store = StateStore(out, meta)
    bar = tqdm(total=len(items), desc="capture", unit="text", disable=not progress)
    for s in range(n_shards):
        lo, hi = s * config.shard_size, min(len(items), (s + 1) * config.shard_size)
        if store._shard(s).is_dir():
            bar.update(hi - lo)
            continue
        _capture_shard(
            model, items[lo:hi], positions[lo:hi], lo, layers, config, store._shard(s), bar
        )
    bar.close()
    return store


@torch.inference_mode()
def _capture_shard(
    model: HookedModel,
    items: Sequence[TextPositions],
    positions: list[list[int]],
    first_item: int,
    layers: list[int],
    config: CaptureConfig,
    final: Path,
    bar,
) -> None:
    n_rows = sum(len(p) for p in positions)
    dtype = STORE_DTYPES[config.state_dtype]
    resid = {L: np.zeros((n_rows, model.d_model), dtype=dtype) for L in layers}
    heads = (
        {L: np.zeros((n_rows, model.n_heads, model.head_dim), dtype=dtype) for L in layers}
        if config.heads
        else {}
    )
    starts = np.cumsum([0] + [len(p) for p in positions])
    gather = _Gather()
    last = max(layers)

    def make_hook(layer: int):
        def hook(module, args, output):
            h = output[0] if isinstance(output, tuple) else output
            resid[layer][gather.rows] = h[gather.b, gather.pos].float().cpu().numpy()
            if layer == last:
                raise _Stop

        return hook

    handles = [model.blocks[L].register_forward_hook(make_hook(L)) for L in layers]
    extra = (_HeadCapture(gather, heads),) if config.heads else ()
    pad = model.tokenizer.pad_token_id
    pad = 0 if pad is None else pad
    # Only tokens up to the last wanted position matter (the model is causal); sorting by
    # that length keeps padding small.
    lengths = [max(p) + 1 for p in positions]
    order = sorted(range(len(items)), key=lambda i: -lengths[i])
    try:
        with model.hooks(*extra, layers=layers if extra else []):
            for b0 in range(0, len(order), config.batch_size):
                batch = order[b0 : b0 + config.batch_size]
                n = max(lengths[i] for i in batch)
                ids = torch.full((len(batch), n), pad, dtype=torch.long)
                mask = torch.zeros((len(batch), n), dtype=torch.long)
                bi, pi, rows = [], [], []
                for j, i in enumerate(batch):
                    ids[j, : lengths[i]] = torch.as_tensor(list(items[i].input_ids[: lengths[i]]))
                    mask[j, : lengths[i]] = 1
                    bi += [j] * len(positions[i])
                    pi += positions[i]
                    rows += range(starts[i], starts[i + 1])
                # CPU indices: under --device-map each layer's output sits on its own GPU.
                gather.b = torch.tensor(bi)
                gather.pos = torch.tensor(pi)
                gather.rows = np.asarray(rows)
                # Right padding: a causal model's real tokens never see the pads, and their
                # position ids stay 0..n-1. The mask is passed only when lengths differ.
                kw = {} if bool(mask.all()) else {"attention_mask": mask.to(model.device)}
                with contextlib.suppress(_Stop):
                    model.model.base_model(input_ids=ids.to(model.device), use_cache=False, **kw)
                bar.update(len(batch))
    finally:
        for h in handles:
            h.remove()
    item_idx = np.repeat(np.arange(first_item, first_item + len(items)), np.diff(starts))
    flat_pos = np.asarray([p for ps in positions for p in ps], dtype=np.int64)
    tokens = np.asarray(
        [items[i].input_ids[p] for i in range(len(items)) for p in positions[i]], dtype=np.int64
    )

    def fill(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        np.savez(tmp / "rows.npz", item=item_idx, position=flat_pos, token=tokens)
        for L in layers:
            np.save(tmp / f"resid-L{L:02d}.npy", resid[L])
            if config.heads:
                np.save(tmp / f"heads-L{L:02d}.npy", heads[L])

    # A temporary folder renamed when whole: a shard cut short by a crash is redone whole.
    write_atomic(final, fill)
