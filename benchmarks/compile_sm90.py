"""Compile every CUDA kernel of headhunt.kernels for sm_90 on any machine (no GPU needed) and
write, per kernel variant, its register count, spills, shared memory and a hash of its PTX.

Used to check that a change that should not touch the generated code (moving kernels between
modules, renaming helpers) does not: run it before and after, on the same Triton, and compare
the two JSON files (``--compare old.json new.json``). The PTX is hashed without its debug lines
(``.loc`` / ``.file``, which name source files and lines), so equal hashes mean the same
instructions in the same order, hence the same SASS from the same ptxas.

    python benchmarks/compile_sm90.py --out before.json
    python benchmarks/compile_sm90.py --compare before.json after.json

Kernels are found by name in the modules of ``headhunt.kernels``, so the check works across a
restructuring. Arguments are CPU tensors (only their dtypes and alignment matter) and TMA
descriptors over them; a fake driver gives Triton the sm_90 target, and kernels are compiled,
never launched.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class _FakeDriver:
    """Just enough of Triton's active driver to compile for sm_90 without a GPU."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0


def _kernels() -> dict:
    """Every JIT kernel (name ending in ``_kernel``) of the headhunt.kernels modules."""
    import headhunt.kernels as pkg

    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        try:
            mod = importlib.import_module(f"headhunt.kernels.{info.name}")
        except ImportError:
            continue
        for name, obj in vars(mod).items():
            if name.endswith("_kernel") and hasattr(obj, "arg_names"):
                found[name] = obj
    return found


_FLOATS = {"qk_scale", "sc_in", "sc_out"}
_DTYPES = {"ARG": torch.int64, "PA": torch.int32, "LO": torch.int32, "HI": torch.int32,
           "MRANGE": torch.int32, "KLO": torch.int64, "KHI": torch.int64, "PTRS": torch.int64,
           "OUT": torch.bfloat16, "Q": torch.bfloat16, "K": torch.bfloat16, "V": torch.bfloat16,
           "K0": torch.bfloat16, "SKIP": torch.uint8}  # fmt: skip


def _args(kernel, consts: dict, dtype: torch.dtype, descs: dict) -> list:
    """Positional arguments of ``kernel``: tensors for pointers (upper-case names), odd ints
    (no divisibility specialisation), floats, descriptors from ``descs``, ``consts``."""
    consts = {"ALIBI": False, **consts}  # flags newer kernels take, off unless a variant sets them
    args = []
    for name in kernel.arg_names:
        if name == "num_warps":  # Gluon kernels take it as a parameter: the launch option
            continue
        if name in descs:
            args.append(descs[name])
        elif name in consts:
            args.append(consts[name])
        elif name in _FLOATS:
            args.append(0.125)
        elif name.isupper() or name[0].isupper():
            dt = _DTYPES.get(name, torch.float32)
            if dt == torch.bfloat16:
                dt = dtype
            args.append(torch.empty(64, dtype=dt))
        else:
            args.append(1001)
    return args


def _tma_desc(rows: int, d: int, dtype: torch.dtype):
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = torch.empty(4096, d, dtype=dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, d])


def _gluon_desc(rows: int, d: int, dtype: torch.dtype):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    t = torch.empty(4096, d, dtype=dtype)
    gdt = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([rows, d], gdt)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, d], layout)


def _variants():
    """(kernel name, variant label, constexprs, dtype, descriptors, num_warps, num_stages):
    a few variants per kernel that together take every branch of its constexpr flags."""
    bf, d = torch.bfloat16, 128
    tma2 = {"Q": _tma_desc(64, d, bf), "K": _tma_desc(128, d, bf)}
    for bounds, softcap, sinks, ent, argmax, pipe, exp, tma in (
        (0, 0, 0, 0, 2, 1, 0, 1), (1, 1, 1, 1, 1, 0, 1, 0), (0, 1, 0, 1, 3, 1, 3, 0),
        (1, 0, 1, 0, 2, 0, 2, 1),
    ):  # fmt: skip
        c = dict(D=d, BLOCK_D=d, BLOCK_M=64, BLOCK_N=128, CAUSAL=True, BOUNDS=bool(bounds),
                 SOFTCAP=bool(softcap), SINKS=bool(sinks), ENTROPY=bool(ent), ARGMAX=argmax,
                 PIPELINE=bool(pipe), PRECISION="tf32", UPCAST=False, EXP=exp, ASM=True,
                 TMA=bool(tma))  # fmt: skip
        label = f"{bounds}{softcap}{sinks}{ent}{argmax}{pipe}{exp}{tma}"
        yield "_row_stats_kernel", label, c, bf, tma2 if tma else {}, 4, 3
    for bounds, softcap, pipe, exp, tma, causal in (
        (0, 0, 0, 0, 1, 1), (1, 1, 0, 3, 1, 1), (0, 1, 1, 2, 0, 0),
    ):  # fmt: skip
        c = dict(D=d, BLOCK_D=d, BLOCK_N=128, BLOCK_M=64, CAUSAL=bool(causal),
                 BOUNDS=bool(bounds), SOFTCAP=bool(softcap), PIPELINE=bool(pipe),
                 PRECISION="tf32", UPCAST=False, EXP=exp, ASM=True, TMA=bool(tma))  # fmt: skip
        label = f"{bounds}{softcap}{pipe}{exp}{tma}{causal}"
        yield "_col_stats_kernel", label, c, bf, tma2 if tma else {}, 4, 3
    for tma, causal in ((1, 1), (0, 0)):
        c = dict(D=d, BLOCK_D=d, BLOCK_N=128, BLOCK_M=64, CAUSAL=bool(causal),
                 PRECISION="tf32", UPCAST=False, TMA=bool(tma))  # fmt: skip
        yield "_col_fast_kernel", f"{tma}{causal}", c, bf, tma2 if tma else {}, 4, 3
    for lo, hi, softcap, ent, exp in ((0, 0, 0, 0, 0), (1, 1, 1, 1, 2)):
        c = dict(D=d, BLOCK_D=d, BLOCK_R=16, BLOCK_N=64, CAUSAL=True, HAS_LO=bool(lo),
                 HAS_HI=bool(hi), SOFTCAP=bool(softcap), ENTROPY=bool(ent),
                 PRECISION="tf32", UPCAST=False, EXP=exp, ASM=True)  # fmt: skip
        yield "_decode_split_kernel", f"{lo}{hi}{softcap}{ent}{exp}", c, bf, {}, 4, 3
    c = dict(D=d, BLOCK_D=d, BLOCK_R=16, BLOCK_N=64, PRECISION="tf32", UPCAST=False,
             HAS_SKIP=True)  # fmt: skip
    yield "_argmax_split_kernel", "1", c, bf, {}, 4, 3
    for bounds, causal, softcap, sinks, ent, argmax, tma in (
        (0, 1, 0, 0, 1, 3, 1), (1, 1, 1, 1, 1, 2, 0), (0, 0, 0, 1, 0, 1, 1),
    ):  # fmt: skip
        c = dict(D=d, BLOCK_D=d, BLOCK_M=128, BLOCK_N=128, CAUSAL=bool(causal),
                 BOUNDS=bool(bounds), SOFTCAP=bool(softcap), SINKS=bool(sinks),
                 ENTROPY=bool(ent), ARGMAX=argmax, PRECISION="tf32", UPCAST=False, EXP=0,
                 ASM=True, TMA=bool(tma))  # fmt: skip
        descs = {"Q": _tma_desc(128, d, bf), "K": _tma_desc(128, d, bf),
                 "V": _tma_desc(128, d, bf)}  # fmt: skip
        label = f"{bounds}{causal}{softcap}{sinks}{ent}{argmax}{tma}"
        yield "_fused_fwd_kernel", label, c, bf, descs if tma else {}, 8, 2
    for gd, causal, ent in ((128, 1, 1), (64, 0, 0)):
        descs = {"q_desc": _gluon_desc(128, gd, bf), "k_desc": _gluon_desc(128, gd, bf),
                 "v_desc": _gluon_desc(128, gd, bf)}  # fmt: skip
        c = dict(D=gd, BLOCK_M=128, BLOCK_N=128, STAGES=2, CAUSAL=bool(causal),
                 ENTROPY=bool(ent))  # fmt: skip
        yield "_gluon_fwd_kernel", f"d{gd}-{causal}{ent}", c, bf, descs, 8, 3
    for causal, ent in ((1, 1), (0, 0)):
        descs = {"q_desc": _gluon_desc(64, d, bf), "k_desc": _gluon_desc(128, d, bf),
                 "v_desc": _gluon_desc(128, d, bf)}  # fmt: skip
        c = dict(D=d, BLOCK_N=128, STAGES=2, CAUSAL=bool(causal), ENTROPY=bool(ent),
                 REGS0=240, REGS1=32)  # fmt: skip
        yield "_gluon_ws_kernel", f"{causal}{ent}", c, bf, descs, 4, 3
    # ALiBi (kernels from issue 28.3 on; older kernels have no ALIBI and ignore it)
    c = dict(D=d, BLOCK_D=d, BLOCK_M=64, BLOCK_N=128, CAUSAL=True, BOUNDS=False, SOFTCAP=False,
             SINKS=False, ENTROPY=True, ARGMAX=2, PIPELINE=True, PRECISION="tf32",
             UPCAST=False, EXP=0, ASM=True, TMA=True, ALIBI=True)  # fmt: skip
    yield "_row_stats_kernel", "alibi", c, bf, tma2, 4, 3
    c = dict(D=d, BLOCK_D=d, BLOCK_N=128, BLOCK_M=64, CAUSAL=True, BOUNDS=False,
             SOFTCAP=False, PIPELINE=False, PRECISION="tf32", UPCAST=False, EXP=0, ASM=True,
             TMA=True, ALIBI=True)  # fmt: skip
    yield "_col_stats_kernel", "alibi", c, bf, tma2, 4, 3
    c = dict(D=d, BLOCK_D=d, BLOCK_R=16, BLOCK_N=64, CAUSAL=True, HAS_LO=False, HAS_HI=False,
             SOFTCAP=False, ENTROPY=True, PRECISION="tf32", UPCAST=False, EXP=0, ASM=True,
             ALIBI=True)  # fmt: skip
    yield "_decode_split_kernel", "alibi", c, bf, {}, 4, 3
    c = dict(D=d, BLOCK_D=d, BLOCK_M=128, BLOCK_N=128, CAUSAL=True, BOUNDS=False,
             SOFTCAP=False, SINKS=False, ENTROPY=True, ARGMAX=3, PRECISION="tf32",
             UPCAST=False, EXP=0, ASM=True, TMA=True, ALIBI=True)  # fmt: skip
    descs = {"Q": _tma_desc(128, d, bf), "K": _tma_desc(128, d, bf), "V": _tma_desc(128, d, bf)}
    yield "_fused_fwd_kernel", "alibi", c, bf, descs, 8, 2
    c = dict(BLOCK_R=16, BLOCK_S=16, SINKS=True, ENTROPY=True)
    yield "_decode_combine_kernel", "11", c, bf, {}, 4, 3
    c = dict(BLOCK_R=16, BLOCK_S=16, HAS_SKIP=True)
    yield "_argmax_combine_kernel", "1", c, bf, {}, 4, 3


def _ptx_hash(ptx: str) -> str:
    """Hash of the PTX code: the debug sections (from the first ``.section``, which name
    inlined functions and source lines), ``.loc`` / ``.file`` / comment lines and the labels
    that only mark where inlined functions start and end (``$L__tmpN:``) left out."""
    i = ptx.find(".section")
    body = ptx[:i] if i >= 0 else ptx
    lines = [
        ln for ln in body.splitlines() if not re.match(r"\s*(\.loc|\.file|//|\$L__tmp\d+:)", ln)
    ]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def compile_all(only: str | None = None) -> dict:
    driver.set_active(_FakeDriver())
    kernels = _kernels()
    results = {}
    for name, label, consts, dtype, descs, warps, stages in _variants():
        key = f"{name}[{label}]"
        if only and only not in key:
            continue
        kernel = kernels.get(name)
        if kernel is None:
            results[key] = {"error": "kernel not found"}
            continue
        try:
            args = _args(kernel, consts, dtype, descs)
            compiled = kernel.warmup(*args, grid=(1,), num_warps=warps, num_stages=stages)
            results[key] = {
                "regs": compiled.n_regs if hasattr(compiled, "n_regs") else None,
                "spills": getattr(compiled, "n_spills", None),
                "shared": compiled.metadata.shared,
                "ptx": _ptx_hash(compiled.asm["ptx"]),
            }
            if results[key]["regs"] is None:
                from triton.tools.disasm import get_sass  # noqa: F401

                results[key]["regs"] = _regs(compiled.asm["cubin"])
        except Exception as e:  # noqa: BLE001 - recorded per variant
            results[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(key, results[key], flush=True)
    return results


def _regs(cubin: bytes) -> int | None:
    """Registers per thread from the cubin (cuobjdump -res-usage)."""
    import os
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+)", out)
    return int(m.group(1)) if m else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the results here (JSON)")
    ap.add_argument("--only", help="only variants whose key contains this")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    a = ap.parse_args()
    if a.compare:
        old, new = (json.loads(Path(p).read_text()) for p in a.compare)
        diff = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        for k in diff:
            print(k, old.get(k), "->", new.get(k))
        print(f"{len(old)} / {len(new)} variants, {len(diff)} differ")
        return 1 if diff else 0
    results = compile_all(a.only)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    errors = sum("error" in r for r in results.values())
    print(f"{len(results)} variants, {errors} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
