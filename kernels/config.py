"""Launch configurations of the Triton kernels: tile sizes, warps, stages and code choices.

:class:`KernelConfig` serves the row and column passes of
:func:`~headhunt.kernels.launch.attention_stats_triton`; :class:`FusedConfig` adds the fused
forward's own choices (its Hopper fast path in Gluon). The defaults come from benchmarks on H100
and H200 cards (BENCHMARKS.md). Nothing here imports Triton.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

__all__ = [
    "FusedConfig",
    "KernelConfig",
    "default_config",
    "exp_mode",
    "fused_config",
    "interpreting",
    "sm_count",
]


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``: CPU tensors,
    no CUDA); configurations are then tiny, since every tile element costs Python time."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (2 under the interpreter)."""
    if interpreting():
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch parameters of the two kernels.

    Attributes:
        row_block_m: Query rows per program in the row-stats pass.
        row_block_n: Keys per inner-loop tile in the row-stats pass.
        row_warps: Warps per program in the row-stats pass.
        row_stages: Software-pipelining depth of the row-stats key loop.
        col_block_n: Keys per program in the column-stats pass.
        col_block_m: Query rows per inner-loop tile in the column-stats pass.
        col_warps: Warps per program in the column-stats pass.
        col_stages: Software-pipelining depth of the column-stats query loop.
        argmax_mode: How pass 1 finds the argmax: 1 = one max-with-index reduction;
            2 = max, then the first column equal to it; 3 = like 2 but the index search
            runs only for tiles where some row's running max improved.
        row_pipeline: Issue the next key tile's q.k product before the current tile's
            softmax work in pass 1 (lets the tensor cores overlap the exp2 work).
        col_pipeline: The same for the query loop of pass 2 (the general column kernel's;
            set, it also serves the masks the specialised kernel would, see
            :func:`~headhunt.kernels.triton_columns.fast_columns_apply`).
        row_exp: How pass 1 evaluates its exponentials (arguments <= 0, computed in fp32,
            results summed in fp32): 0 ``tl.math.exp2``; 1 rounded to fp16 and two per
            ``ex2.approx.f16x2`` (relative error ~1e-3 per term); 2 ``ex2.approx.ftz.f32``;
            3 half of them as in 2, half by a polynomial on the FMA units (relative error
            7.5e-5 per term). fp32 inputs use 2 instead of 1 or 3.
        col_exp: The same for pass 2's ``p = exp2(s - lse)`` (likewise the general kernel's).
        row_tma: Pass 1 loads q and k tiles by bulk tensor copies (TMA descriptors)
            where the inputs allow it (compiled, contiguous, power-of-two d, Hopper or
            later); else pointer loads.
        col_tma: The same for pass 2 (the specialised column kernel also over the
            [b, n, heads, d] memory of a model's projections).
        fp32_dot: ``tl.dot`` precision for fp32 inputs: "tf32x3" (tensor cores, ~1e-6
            relative error) or "ieee" (exact, FMA units).
    """

    row_block_m: int = 128
    row_block_n: int = 64
    row_warps: int = 4
    row_stages: int = 3
    col_block_n: int = 128
    col_block_m: int = 64
    col_warps: int = 4
    col_stages: int = 3
    argmax_mode: int = 1
    row_pipeline: bool = False
    col_pipeline: bool = False
    row_exp: int = 0
    col_exp: int = 0
    row_tma: bool = False
    col_tma: bool = False
    fp32_dot: str = "tf32x3"


def exp_mode(mode: int, dtype: torch.dtype) -> int:
    """The exp2 mode a launch uses: fp32 inputs (tolerance 1e-3) never get the fp16 (1)
    or polynomial (3) exponentials, only the exact-enough fp32 ones (0, 2)."""
    if dtype == torch.float32 and mode in (1, 3):
        return 2
    return mode


def default_config(head_dim: int, dtype: torch.dtype = torch.bfloat16) -> KernelConfig:
    """Launch configuration used when none is given.

    Args:
        head_dim: Head dimension ``d`` of q and k.
        dtype: Input dtype; fp32 gets its own (smaller, unpipelined) tiles, since its
            tiles take twice the shared memory and its products three tf32 MMAs.

    Returns:
        The configuration for this head dimension (tiny tiles under the interpreter,
        where every tile element costs Python time).
    """
    if interpreting():
        return KernelConfig(16, 16, 1, 1, 16, 16, 1, 1)
    if dtype == torch.float32:
        stages = 3 if head_dim <= 64 else 2
        return KernelConfig(
            64, 64, 4, stages, 64, 64, 4, stages, argmax_mode=2, row_tma=True, col_tma=True
        )
    # Fastest variants of benchmarks/bench_kernels.py --sweep / --sweep-exp on an H200 at
    # n = 16k, causal, bf16 (pass 1 ranked on random + attention-sink data; BENCHMARKS.md):
    # q and k tiles by TMA where the inputs allow (row_tma / col_tma); pass 1 with 64-row
    # query tiles, 128-key tiles, max-then-index argmax and a software-pipelined key loop;
    # pass 2 with 64 x 128 tiles for d <= 64 and 128 x 64 for d = 128.
    col = (64, 128, 4, 3) if head_dim <= 64 else (128, 64, 4, 3)
    return KernelConfig(
        64, 128, 4, 3, *col, argmax_mode=2, row_pipeline=True, row_tma=True, col_tma=True
    )


@dataclasses.dataclass(frozen=True)
class FusedConfig(KernelConfig):
    """:class:`KernelConfig` plus the fused forward's own launch choices (a plain
    KernelConfig runs with their defaults).

    Attributes:
        fast_path: Plain causal / full masks on Hopper run the Gluon kernel of
            :mod:`headhunt.kernels.gluon_fused` with the ``gluon_*`` choices below.
        gluon_warps: Its warps per program (``16 * gluon_warps`` query rows).
        gluon_block_n: Its keys per tile.
        gluon_stages: Its shared-memory slots for K and V tiles.
        gluon_ws: Its warp-specialised variant (two consumer warpgroups of 64 rows and a
            TMA loader warpgroup; ``gluon_warps`` unused), with ``gluon_regs`` registers per
            thread for the second consumer and the loader (the first gets what is left of
            the 64K: Triton's warp-group allocation).
    """

    fast_path: bool = False
    gluon_warps: int = 8
    gluon_block_n: int = 128
    gluon_stages: int = 2
    gluon_ws: bool = False
    gluon_regs: tuple[int, int] = (240, 32)


def fused_config(head_dim: int, dtype: torch.dtype = torch.bfloat16) -> FusedConfig:
    """Tiles of the fused forward (``row_*`` fields, ``argmax_mode``, the ``gluon_*`` fast
    path) and of the column pass (``col_*``, as :func:`default_config` sets them).

    bf16/fp16: the plain causal / full masks on Hopper take the Gluon kernel (``fast_path``;
    BENCHMARKS.md "Fused statistics" has the variants measured), for d = 128 its
    warp-specialised variant (one 8B-shaped layer on an H100: 61.3 ms at 64k tokens and 253.9 ms
    at 128k, against 70.8 / 292.2 ms for the pipelined one and SDPA's 57.5 / 252-259 ms; d = 64
    keeps the pipelined one, whose speed as warp-specialised was not measured). The general
    kernel, for everything else, with d > 64: the fastest of ``benchmarks/bench_capture.py
    --sweep`` on an H100 (one 8B-shaped layer, 32k tokens, q/k/v laid out as the model gives
    them): 128 x 128 tiles, 8 warps, 2 stages, bulk tensor copies (TMA), and the argmax index
    searched only in tiles where some row's maximum improved (18.1 ms, against 22.1 ms for 128 x
    64 tiles by pointer loads with the search in every tile). Other shapes keep smaller tiles
    (not swept).
    """
    base = FusedConfig(**dataclasses.asdict(default_config(head_dim, dtype)))
    if interpreting():
        return base
    if dtype == torch.float32:
        return dataclasses.replace(base, row_block_m=64, row_block_n=32)
    fast = {"fast_path": True}
    if head_dim <= 64:
        return dataclasses.replace(base, row_block_m=128, row_block_n=64, row_warps=4, **fast)
    return dataclasses.replace(
        base, row_block_m=128, row_block_n=128, row_warps=8, row_stages=2, argmax_mode=3,
        row_tma=True, gluon_ws=True, **fast,
    )  # fmt: skip
