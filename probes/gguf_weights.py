"""A GGUF's weights read straight from the file at every load, exactly as transformers converts
them, with no converted copy on disk.

transformers' GGUF load (``load_gguf_checkpoint`` in ``transformers.modeling_gguf_pytorch_utils``)
spends most of its time on work that does not depend on the weights' values: parsing every
metadata field (the tokenizer's vocabulary: hundreds of thousands of parts) and deriving the
GGUF-tensor -> parameter name map from gguf-py's ``get_tensor_name_map``. The weights themselves
dequantise in seconds. So headhunt keeps only that value-free part (a :class:`Recipe`: the
architecture's processor, the config it reads, the name map) and, at every load, reads the
tensor table with a small header parser that skips the metadata values, dequantises each tensor
with gguf-py's own block functions (what ``gguf.dequantize``, the function transformers calls,
runs; in larger row groups: :func:`dequantize`), applies transformers' own
per-architecture ``TensorProcessor`` and casts to the run's dtype: the same operations in the
same order, so the state dict is bit for bit transformers' own (tests/probes/test_gguf_weights.py).

The GGUF format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Fixed-size metadata value types (GGUFValueType): byte widths.
_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_DEFAULT_ALIGNMENT = 32  # the format's default when general.alignment is absent


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file: its GGUF name, ggml type, dimensions (ggml order: fastest first)
    and absolute byte offset of its data."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    offset: int


class UnreadableHeader(ValueError):
    """A header this parser does not read (big-endian, an unknown version or value type)."""


@dataclass(frozen=True)
class Header:
    """What a GGUF's header says: ``general.architecture``, ``general.name`` (None when
    absent) and the tensor table."""

    architecture: str
    name: str | None
    tensors: list[TensorEntry]


def read_header(path: Path) -> Header:
    """The file's header, read without building any metadata value but the two strings it
    returns (a vocabulary's strings are stepped over by their lengths: 0.1 s where gguf-py's
    reader takes seconds)."""
    strings: dict[str, str] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        if blob[:4] != b"GGUF":
            raise UnreadableHeader("bad magic bytes")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", blob, 4)
        if version not in (2, 3):  # 0 in the low bytes: a big-endian file
            raise UnreadableHeader(f"GGUF version field {version}")
        pos, alignment = 24, _DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key, pos = _string(blob, pos)
            (vtype,) = struct.unpack_from("<I", blob, pos)
            if key == "general.alignment" and vtype == _UINT32:
                (alignment,) = struct.unpack_from("<I", blob, pos + 4)
            elif key in ("general.architecture", "general.name") and vtype == _STRING:
                strings[key] = _string(blob, pos + 4)[0]
            pos = _skip_value(blob, pos + 4, vtype)
        entries = []
        for _ in range(n_tensors):
            name, pos = _string(blob, pos)
            (n_dims,) = struct.unpack_from("<I", blob, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", blob, pos + 4)
            pos += 4 + 8 * n_dims
            ggml_type, offset = struct.unpack_from("<IQ", blob, pos)
            pos += 12
            entries.append(TensorEntry(name, ggml_type, tuple(dims), offset))
    if alignment == 0 or alignment & (alignment - 1):
        raise UnreadableHeader(f"alignment {alignment}")
    if "general.architecture" not in strings:
        raise UnreadableHeader("no general.architecture")
    start = -(-pos // alignment) * alignment
    tensors = [TensorEntry(e.name, e.ggml_type, e.dims, start + e.offset) for e in entries]
    return Header(strings["general.architecture"], strings.get("general.name"), tensors)


def _string(blob, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", blob, pos)
    return blob[pos + 8 : pos + 8 + n].decode("utf-8"), pos + 8 + n


def _skip_value(blob, pos: int, vtype: int) -> int:
    """The offset just past one metadata value of type ``vtype`` starting at ``pos``."""
    if vtype in _WIDTH:
        return pos + _WIDTH[vtype]
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", blob, pos)
        return pos + 8 + n
    if vtype == _ARRAY:
        etype, count = struct.unpack_from("<IQ", blob, pos)
        pos += 12
        if etype in _WIDTH:
            return pos + count * _WIDTH[etype]
        for _ in range(count):  # strings (a vocabulary) or nested arrays
            pos = _skip_value(blob, pos, etype)
        return pos
    raise UnreadableHeader(f"metadata value type {vtype}")


def tensor_data(blob, entry: TensorEntry):
    """The tensor's bytes as gguf-py's ``GGUFReader`` presents them (same dtype and shape, a
    view of ``blob``, the file mapped as a numpy uint8 array): what ``gguf.dequantize`` takes."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    qtype = GGMLQuantizationType(entry.ggml_type)
    n = 1
    for d in entry.dims:
        n *= d
    shape = tuple(reversed(entry.dims))
    plain = {
        GGMLQuantizationType.F16: np.float16,
        GGMLQuantizationType.F32: np.float32,
        GGMLQuantizationType.F64: np.float64,
        GGMLQuantizationType.I8: np.int8,
        GGMLQuantizationType.I16: np.int16,
        GGMLQuantizationType.I32: np.int32,
        GGMLQuantizationType.I64: np.int64,
    }
    if qtype in plain:
        item, count = np.dtype(plain[qtype]), n
    else:
        block, size = GGML_QUANT_SIZES[qtype]
        item, count = np.dtype(np.uint8), n * size // block
        shape = quant_shape_to_byte_shape(shape, qtype)
    return blob[entry.offset : entry.offset + count * item.itemsize].view(item).reshape(shape)


@dataclass
class Recipe:
    """What turns a GGUF's tensors into a model's state dict, none of it the weights' values:
    the file's architecture (picks transformers' ``TensorProcessor``), the config dict that
    processor reads (transformers' parse of the metadata) and the GGUF -> parameter name map."""

    architecture: str
    processor_config: dict[str, Any]
    name_map: dict[str, str]
    # The file's tensor table (name, ggml type, dims, absolute offset), so that a later load
    # does not walk the header's metadata again (a 151k-token vocabulary: 300k values stepped
    # over in Python). The recipe is kept per file content, so the table is the file's.
    tensors: list[list] | None = None

    def tensor_entries(self) -> list[TensorEntry] | None:
        if self.tensors is None:
            return None
        return [
            TensorEntry(n, int(t), tuple(int(d) for d in dims), int(o))
            for n, t, dims, o in self.tensors
        ]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> Recipe:
        return cls(**json.loads(path.read_text()))


def make_recipe(path: Path, config) -> Recipe:
    """The recipe of a GGUF whose model has ``config`` (from transformers' own parse of the
    file): the processor config from ``load_gguf_checkpoint`` and the name map from
    ``get_gguf_hf_weights_map`` over the model's parameter names (a model built on the meta
    device: no memory, no initialisation)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )

    parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    header = read_header(path)
    architecture = header.architecture
    processor_config = parsed["config"]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=processor_config)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    name_map = get_gguf_hf_weights_map(skeleton, processor)
    tensors = [[e.name, e.ggml_type, list(e.dims), e.offset] for e in header.tensors]
    return Recipe(architecture, json.loads(json.dumps(processor_config)), name_map, tensors)


# At most this many tensors are dequantised at once (see :func:`load_threads`).
_MAX_THREADS = 4


def load_threads() -> int:
    """How many tensors a load dequantises at once: the CPUs this process may run on, at most
    :data:`_MAX_THREADS` (1 on a one-CPU machine: no thread is started)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call (macOS)
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, _MAX_THREADS))


def state_dict(path: Path, recipe: Recipe, dtype, on_tensor=None) -> dict:
    """The GGUF's tensors as transformers' ``load_gguf_checkpoint`` returns them (its loop,
    step for step: dequantise, process, rename, cast to ``dtype``), read from the mapped file.
    ``on_tensor(i, n)`` is called after each tensor (a progress line).

    With :func:`load_threads` above one, the dequantisation runs on that many Python threads,
    in pieces of a few million values (a large tensor on all of them at once; see
    :func:`_work`), with torch on one thread inside each (torch's and numpy's operations
    release the GIL, and the kernel's page faults for the fresh memory then run side by side
    too); the rest of the loop (process, rename, cast) runs here,
    in the file's order, as each tensor's values arrive. Every tensor goes through the same
    operations as on one thread, so the values are the same bits."""
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    from headhunt.probes.gguf_dequant import one_thread

    processor = TENSOR_PROCESSORS.get(recipe.architecture, TensorProcessor)(
        config=recipe.processor_config
    )
    parsed: dict[str, Any] = {"config": recipe.processor_config, "tensors": {}}
    entries = recipe.tensor_entries() or read_header(path).tensors
    blob = np.memmap(path, mode="r", dtype=np.uint8)  # pages are read as tensors need them
    threads = min(load_threads(), len(entries))
    # one_thread restores the caller's thread count on the way out, after the pool has ended.
    # Closing the values stops the pool (an error here) before one_thread's exit.
    with one_thread():
        values = (
            (_dequantized(blob, entry) for entry in entries)
            if threads <= 1
            else _dequantized_in_pool(blob, entries, threads)
        )
        with contextlib.closing(values):
            for i, (entry, weights) in enumerate(zip(entries, values, strict=True), 1):
                _add_tensor(blob, weights, entry, processor, recipe, parsed, dtype)
                if on_tensor is not None:
                    on_tensor(i, len(entries))
    return parsed["tensors"]


def _dequantized(blob, entry: TensorEntry):
    """The tensor's values, dequantised to float32 (numpy)."""
    from gguf import GGMLQuantizationType

    return dequantize(tensor_data(blob, entry), GGMLQuantizationType(entry.ggml_type))


def _torch_on_one_thread() -> None:
    """A pool thread's torch on one thread (the count is per thread: a new thread starts from
    the last count set anywhere, which the caller's :func:`one_thread` made 1)."""
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def _work(blob, entry: TensorEntry):
    """A tensor's dequantisation as pieces for the pool: (pieces, finish); each piece a
    callable, ``finish`` given their results in order returns the float32 values (numpy). A
    block type :mod:`headhunt.probes.gguf_dequant` handles is split into runs of blocks (so
    that one large tensor keeps every thread busy); any other tensor is one piece."""
    from gguf import GGMLQuantizationType

    from headhunt.probes import gguf_dequant

    data = tensor_data(blob, entry)
    planned = gguf_dequant.pieces(data, entry.ggml_type)
    if planned is None:
        return [lambda: _dequantized(blob, entry)], lambda results: results[0]
    out, work = planned

    def finish(results: list[bool]):
        if all(results):
            return out.numpy()  # the same memory: torch.from_numpy in state_dict copies nothing
        return dequantize(data, GGMLQuantizationType(entry.ggml_type))  # a non-finite scale

    return work, finish


def _in_pool(piece):
    """One piece of a tensor's dequantisation, run on a pool thread."""
    return piece()


def _dequantized_in_pool(blob, entries: list[TensorEntry], threads: int):
    """Each tensor's dequantised values, in the file's order, computed in pieces ``threads`` at
    a time (:func:`_work`). Tensors are queued until ``2 * threads`` pieces wait behind the one
    the caller takes next (a bfloat16 load holds few float32 tensors at once); an error in one
    is raised here, after the pool has stopped."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    ahead = 2 * threads
    with ThreadPoolExecutor(threads, initializer=_torch_on_one_thread) as pool:
        pending: deque = deque()  # (futures, finish) per tensor, in the file's order
        queued = 0  # futures in pending

        def take():
            nonlocal queued
            futures, finish = pending[0]
            results = [future.result() for future in futures]  # an error: still pending
            pending.popleft()
            queued -= len(futures)
            return finish(results)

        try:
            for entry in entries:
                work, finish = _work(blob, entry)
                pending.append(([pool.submit(_in_pool, piece) for piece in work], finish))
                queued += len(work)
                while pending and queued - len(pending[0][0]) >= ahead:
                    yield take()
            while pending:
                yield take()
        finally:
            for futures, _ in pending:
                for future in futures:
                    future.cancel()


def _add_tensor(
    blob, weights, entry: TensorEntry, processor, recipe: Recipe, parsed: dict, dtype
) -> None:
    """The rest of one step of ``load_gguf_checkpoint``'s loop: process, rename, cast."""
    import numpy as np
    import torch

    result = processor.process(
        weights=weights,
        name=entry.name,
        tensor_key_mapping=recipe.name_map,
        parsed_parameters=parsed,
    )
    if result.name not in recipe.name_map:
        return
    weights = result.weights
    # transformers copies every tensor; only one that still reads the mapped file (a float32
    # tensor) or a strided view needs it: the values are the same either way.
    if np.may_share_memory(weights, blob) or not weights.flags.c_contiguous:
        weights = np.copy(weights)
    tensor = torch.from_numpy(weights)
    if dtype is not None:
        tensor = tensor.to(dtype)
    parsed["tensors"][recipe.name_map[result.name]] = tensor


# Elements dequantised per call of gguf-py's block function: 4 MB of float32, large enough that
# numpy's per-call overhead vanishes, small enough to stay in cache with its temporaries.
_CHUNK_ELEMENTS = 1 << 20


def dequantize(data, qtype):
    """``gguf.dequantize(data, qtype)``, bit for bit, in a third to a half of its time.

    The common block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) go to
    :mod:`headhunt.probes.gguf_dequant` (the same arithmetic in torch, faster still). For the
    others, gguf-py dequantises a quantised tensor 16 rows per call of the type's ``dequantize_rows``
    (a few thousand values: numpy's per-call overhead dominates); this calls the same function
    on rows of about a million values. Each block's values depend on that block's bytes alone
    (elementwise float32 arithmetic), so the grouping cannot change a bit
    (tests/probes/test_gguf_weights.py compares both on every quantisation of the bundled models
    and the tiny GGUFs). Plain float tensors, and any type gguf-py handles otherwise, go to
    ``gguf.dequantize`` itself."""
    import numpy as np
    from gguf import dequantize as gguf_dequantize
    from gguf import quants

    from headhunt.probes.gguf_dequant import dequantize as dequantize_in_torch

    fast = dequantize_in_torch(data, qtype)
    if fast is not None:
        return fast.numpy()  # the same memory: torch.from_numpy in state_dict copies nothing
    traits = getattr(quants, "_type_traits", {}).get(qtype)
    if traits is None or data.ndim < 1 or data.size == 0:
        return gguf_dequantize(data, qtype)
    traits.init_grid()
    shape = quants.quant_shape_from_byte_shape(data.shape, qtype)
    rows = data.reshape(-1, data.shape[-1])
    out = np.empty((rows.shape[0], shape[-1]), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // shape[-1])
    for start in range(0, rows.shape[0], step):
        out[start : start + step] = traits.dequantize_rows(rows[start : start + step])
    return out.reshape(shape)


def fingerprint(model) -> dict[str, str]:
    """SHA-256 of every parameter and buffer of a model (persistent or not; dtype and shape
    included), by name: two loads are the same model bit for bit exactly when these match."""
    import hashlib

    import torch

    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors |= dict(model.named_buffers(remove_duplicate=False))
    out = {}
    for name, t in sorted(tensors.items()):
        head = f"{t.dtype}|{tuple(t.shape)}|".encode()
        flat = t.detach().cpu().contiguous().reshape(-1)  # 0-d buffers too (a scale)
        out[name] = hashlib.sha256(head + flat.view(torch.uint8).numpy().tobytes()).hexdigest()
    return out
