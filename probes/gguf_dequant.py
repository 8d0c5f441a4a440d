"""gguf-py's dequantisation of the common GGUF block types, bit for bit, in torch.

gguf-py's numpy block functions (``gguf.quants``, what ``gguf.dequantize`` and so transformers'
GGUF load run) make a full-size temporary array for every step of a block (split, shift, mask,
cast, scale): at 1.5B parameters the weights' dequantisation costs tens of seconds. The same
float32 operations, in the same order, written by torch into the parameter's own memory a
cache-sized group of blocks at a time on one thread (:func:`one_thread` says why), give the same
bits in a fraction of the time: IEEE float32 multiplication, addition and subtraction are exactly
rounded wherever they run, the float16 scales and small integers convert exactly, and nothing
here is fused (no multiply-add) or reordered. tests/probes/test_gguf_dequant.py compares every
type on random blocks (every float16 scale, NaN and infinity included) and every tensor of both
bundled models with gguf-py's output; a type not listed in :data:`SUPPORTED` goes to gguf-py.

Block layouts: https://github.com/ggml-org/ggml/blob/master/src/ggml-common.h and gguf-py's
``gguf/quants.py`` (https://github.com/ggml-org/llama.cpp/tree/master/gguf-py).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys
import warnings
from collections.abc import Callable

import numpy as np
import torch
from jaxtyping import Float, UInt8
from torch import Tensor

# Blocks dequantised per group: ~512k values (2 MiB of float32): each torch call long enough
# that its overhead is small (per value, Q4_K's and Q6_K's groups took 15-25% less CPU than at
# 256k values and 2-3x less than at 16k on the shared 2-core CPU; larger groups, out of cache,
# took more again).
_GROUP_VALUES = 1 << 19


def _f16(blocks: UInt8[Tensor, "n bytes"], start: int) -> Float[Tensor, "n 1"]:
    """The float16 stored at byte ``start`` of each block, as float32 (exact)."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: UInt8[Tensor, "n g w"]) -> UInt8[Tensor, "n g 2 w"]:
    """Low nibbles, then high nibbles, of each group of ``w`` bytes (gguf-py's ``>> [0, 4]``,
    ``& 0x0F``)."""
    packed = packed.contiguous()  # torch's integer kernels are several times slower on views
    return torch.stack([packed & 0x0F, packed >> 4], dim=-2)


def _bits(packed: UInt8[Tensor, "n g w"], count: int, width: int) -> UInt8[Tensor, "n g c w"]:
    """``count`` fields of ``width`` bits of each byte, lowest first (gguf-py's
    ``>> [0, width, ...]``, ``& mask``)."""
    packed, mask = packed.contiguous(), (1 << width) - 1
    return torch.stack([(packed >> (i * width)) & mask for i in range(count)], dim=-2)


# Each type is two steps: ``scales`` (the per-block float factors, for the whole tensor at once:
# a few percent of its values) and ``fill`` (a group of blocks' values into ``out``, given
# their factors). Together they are gguf-py's arithmetic for the type (in the comment): the
# integers converted exactly to float32, then each multiplication and addition rounded once, as
# numpy rounds them. The float16 scales are finite (checked first), so no value is NaN, where
# the two libraries could pick different NaN payloads, and the order of a product's operands
# cannot matter.


def _d(blocks):
    return (_f16(blocks, 0),)


def _d_m(blocks):
    return _f16(blocks, 0), _f16(blocks, 2)


def _q8_0(blocks, out, d) -> None:  # x * d
    out.copy_(blocks[:, 2:].contiguous().view(torch.int8))
    out.mul_(d)


def _q4_0(blocks, out, d) -> None:  # d * (q - 8)
    out.copy_(_nibbles(blocks[:, 2:].unsqueeze(1)).view(len(blocks), 32).view(torch.int8) - 8)
    out.mul_(d)


def _q4_1(blocks, out, d, m) -> None:  # d * q + m
    out.copy_(_nibbles(blocks[:, 4:].unsqueeze(1)).view(len(blocks), 32))
    out.mul_(d)
    out.add_(m)


def _q5_high(qh: UInt8[Tensor, "n 4"]) -> UInt8[Tensor, "n 32"]:
    """Bit i of the little-endian uint32 ``qh`` (bit i % 8 of byte i // 8) for value i, moved
    to bit 4."""
    return (_bits(qh.unsqueeze(-1), 8, 1) << 4).view(len(qh), 32)


def _q5_0(blocks, out, d) -> None:  # d * ((ql | qh << 4) - 16)
    q = _nibbles(blocks[:, 6:].unsqueeze(1)).view(len(blocks), 32) | _q5_high(blocks[:, 2:6])
    out.copy_(q.view(torch.int8) - 16)
    out.mul_(d)


def _q5_1(blocks, out, d, m) -> None:  # d * (ql | qh << 4) + m
    q = _nibbles(blocks[:, 8:].unsqueeze(1)).view(len(blocks), 32) | _q5_high(blocks[:, 4:8])
    out.copy_(q)
    out.mul_(d)
    out.add_(m)


def _k_scales(blocks) -> tuple[Float[Tensor, "n 8 1"], Float[Tensor, "n 8 1"]]:
    """Q4_K's and Q5_K's eight 6-bit scales and mins (gguf-py's ``Q4_K.get_scale_min``) times
    the block's d and dmin: ``d * sc``, ``dmin * m``."""
    s = blocks[:, 4:16].contiguous().view(len(blocks), 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return (_f16(blocks, 0) * sc).unsqueeze(-1), (_f16(blocks, 2) * mn).unsqueeze(-1)


def _q4_k(blocks, out, scale, low) -> None:  # (d * sc) * q - (dmin * m), per 32 values
    n = len(blocks)
    values = out.view(n, 8, 32)
    values.copy_(_nibbles(blocks[:, 16:].view(n, 4, 32)).view(n, 8, 32))
    values.mul_(scale)
    values.sub_(low)


def _q5_k(blocks, out, scale, low) -> None:  # (d * sc) * (ql | qh << 4) - (dmin * m)
    n = len(blocks)
    q = _nibbles(blocks[:, 48:].view(n, 4, 32)).view(n, 8, 32)
    q |= _bits(blocks[:, 16:48].view(n, 1, 32), 8, 1).view(n, 8, 32) << 4
    values = out.view(n, 8, 32)
    values.copy_(q)
    values.mul_(scale)
    values.sub_(low)


def _q6_k_scales(blocks) -> tuple[Float[Tensor, "n 16 1"]]:
    scale = blocks[:, 192:208].contiguous().view(torch.int8).float()
    return ((_f16(blocks, 208) * scale).unsqueeze(-1),)


def _q6_k(blocks, out, scale) -> None:  # (d * scale) * ((ql | qh << 4) - 32), per 16 values
    n = len(blocks)
    q = _nibbles(blocks[:, :128].view(n, 2, 64)).view(n, 8, 32)
    qh = blocks[:, 128:192].contiguous().view(n, 2, 1, 32)
    # qh's 2-bit fields, lowest first, moved to bits 4-5: (qh >> 2i & 3) << 4
    high = torch.cat([(qh << 4) & 0x30, (qh << 2) & 0x30, qh & 0x30, (qh >> 2) & 0x30], dim=2)
    q |= high.view(n, 8, 32)
    values = out.view(n, 16, 16)
    values.copy_(q.view(torch.int8).view(n, 16, 16) - 32)
    values.mul_(scale)


# ggml type id -> (values per block, bytes per block, byte offsets of its float16 scales,
# the per-block factors, the values)
SUPPORTED: dict[int, tuple[int, int, tuple[int, ...], Callable, Callable]] = {
    2: (32, 18, (0,), _d, _q4_0),
    3: (32, 20, (0, 2), _d_m, _q4_1),
    6: (32, 22, (0,), _d, _q5_0),
    7: (32, 24, (0, 2), _d_m, _q5_1),
    8: (32, 34, (0,), _d, _q8_0),
    12: (256, 144, (0, 2), _k_scales, _q4_k),
    13: (256, 176, (0, 2), _k_scales, _q5_k),
    14: (256, 210, (208,), _q6_k_scales, _q6_k),
}


@contextlib.contextmanager
def one_thread():
    """torch on one thread while open (a caller dequantising many tensors opens it once).

    On groups of blocks this small, torch's threads spend more CPU waiting for each other than
    they save: a 1.5B model's weights took 35 s of CPU on two threads against 8 s on one (the
    2-core machine), and switching the thread count per tensor costs more again. torch's own
    kernels read the count per Python thread, but the call also sets MKL's process-wide count:
    a matrix product running in another thread meanwhile (a dashboard job) runs on one thread
    for those seconds."""
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


# Blocks per piece of a tensor (:func:`pieces`): ~4M values (16 MiB of float32), so that a large
# tensor (a 151k-token embedding: 233M values) keeps every thread of a load's pool busy.
_PIECE_VALUES = 1 << 22


# madvise's MADV_POPULATE_WRITE (Linux 5.14 and later): fault a range in, writable, at once.
_POPULATE_WRITE = 23
_libc_madvise: list = []  # [madvise] once looked up; [None] where there is none to call


def _madvise():
    """libc's ``madvise`` through ctypes (a foreign call releases the GIL, where ``mmap``'s
    method holds it), on Linux; None elsewhere or where a call has failed (an older kernel
    refuses the advice with EINVAL: pages then fault in as they are written)."""
    if not _libc_madvise:
        try:
            found = ctypes.CDLL(None, use_errno=True).madvise if sys.platform == "linux" else None
        except (AttributeError, OSError):
            found = None
        if found is not None:
            found.argtypes, found.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], int
        _libc_madvise.append(found)
    return _libc_madvise[0]


def _populate(fresh: Tensor) -> None:
    """Have the kernel hand out ``fresh``'s pages (a contiguous tensor, not yet written) in one
    call rather than one page fault at a time as the values are written: the same zeroed
    pages, with 14-15% less CPU for faulting and filling a Q4_K or Q6_K tensor (docs/gguf.md,
    run 10; at 1.5B float32 parameters the page faults are over half of a load's
    dequantisation CPU time). Best effort: where the advice is refused, nothing changes but
    the time."""
    madvise = _madvise()
    if madvise is None or fresh.numel() == 0:
        return
    start = fresh.data_ptr()
    first = start - start % mmap.PAGESIZE  # the page holding the tensor's first byte
    if madvise(first, start + fresh.nbytes - first, _POPULATE_WRITE) != 0:
        _libc_madvise[0] = None  # not on this kernel: no more tries


def pieces(data: np.ndarray, qtype: int) -> tuple[Tensor, list[Callable[[], bool]]] | None:
    """A tensor's float32 output, not yet written, and the pieces of work that fill it: each
    fills its own run of blocks (of about :data:`_PIECE_VALUES` values) and returns False,
    writing nothing, where one of its float16 scales is NaN or infinite. Pieces run in any
    order, on any thread: a block's values depend on its bytes alone. None for a type not in
    :data:`SUPPORTED`. ``data``: as for :func:`dequantize`."""
    if int(qtype) not in SUPPORTED or data.dtype != np.uint8 or data.ndim < 1:
        return None
    values, size, scales, factors, fill = SUPPORTED[int(qtype)]
    if data.shape[-1] % size:
        return None
    shape = (*data.shape[:-1], data.shape[-1] // size * values)
    with warnings.catch_warnings():  # a read-only (mapped) array: it is only read here
        warnings.simplefilter("ignore", UserWarning)
        blocks = torch.from_numpy(np.ascontiguousarray(data).reshape(-1, size))
    out = torch.empty(len(blocks), values, dtype=torch.float32)
    step, per_piece = max(1, _GROUP_VALUES // values), max(1, _PIECE_VALUES // values)

    def piece(start: int) -> Callable[[], bool]:
        def run() -> bool:
            part, into = blocks[start : start + per_piece], out[start : start + per_piece]
            if not all(_f16(part, at).isfinite().all() for at in scales):
                # NaN op NaN returns one operand's payload, numpy's and torch's kernels not
                # always the same one: a tensor with a non-finite scale (a damaged file) is
                # left to gguf-py.
                return False
            _populate(into)
            with one_thread():
                per_block = factors(part)
                for at in range(0, len(part), step):
                    group = slice(at, at + step)
                    fill(part[group], into[group], *(f[group] for f in per_block))
            return True

        return run

    return out.view(shape), [piece(start) for start in range(0, len(blocks), per_piece)]


def dequantize(data: np.ndarray, qtype: int) -> Float[Tensor, "*dims"] | None:
    """``gguf.dequantize(data, qtype)`` as a float32 torch tensor, bit for bit, for the block
    types in :data:`SUPPORTED`; None for any other type, or a tensor with a NaN or infinite
    float16 scale (the caller asks gguf-py). ``data`` is the tensor's bytes as gguf-py's reader
    presents them (uint8, last axis in bytes). Its :func:`pieces`, one after the other."""
    planned = pieces(data, qtype)
    if planned is None:
        return None
    out, work = planned
    return out if all(run() for run in work) else None
