"""Column pass (col_sum / col_mean fed every row's final lse) on one attention layer.

Default shape: Llama-3-8B's (32 query / 8 KV heads, d 128), bf16, causal, q/k/v laid out
as a model hands them over ([b, n, heads, d] memory viewed [b, heads, n, d]), random
N(0, 1), lse from the fused forward. Per length, all in one process (median of
``triton.testing.do_bench``): SDPA on the same q/k/v, the fused forward with and without
the column pass, the column pass by the specialised kernel (kernels/triton_columns.py,
default tiles and ``--tiles``), by the general kernel (the build before; on the model's
memory and on contiguous copies), and the floor of the pass: a causal QK^T at the measured
8192^3 ``torch.matmul`` rate, and one exp2 per visible score at the special-function
units' peak (16 per SM per clock at the card's maximum clock). The specialised kernel's
col_sum / col_mean are compared with the general kernel's.

    python benchmarks/bench_columns.py --out cols.json [--n 65536 131072] [--heads 32 8 128]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
import triton
from bench_capture import _mufu_ex2_per_s  # benchmarks/ is on the path when run as a script


def _ms(fn, rep: int) -> float:
    warmup = 3 * rep // 10 + 1
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def layer(n: int, hq: int, hkv: int, d: int, tiles: list[str], mm_flops: float) -> dict:
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from headhunt.kernels import attention_forward
    from headhunt.kernels.config import fused_config
    from headhunt.kernels.launch import prepare
    from headhunt.kernels.triton_columns import launch_columns, launch_general_columns

    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, n, hq, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
    k = torch.randn(1, n, hkv, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
    v = torch.randn(1, n, hkv, d, device=dev, dtype=dt, generator=g).transpose(1, 2)
    rep = 300 if n <= 65536 else 1000
    out: dict = {"tokens": n}
    out["sdpa_ms"] = _ms(lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True), rep)
    out["fused_rows_ms"] = _ms(lambda: attention_forward(q, k, v, key_stats=False), rep)
    out["fused_cols_ms"] = _ms(lambda: attention_forward(q, k, v), rep)
    lse = attention_forward(q, k, v, key_stats=False)[1].lse

    def prepared(qq, kk):
        return prepare(qq, kk, None, fused_config(d, dt)).with_bounds()

    L = prepared(q, k)
    out["config"] = {f: getattr(L.cfg, f) for f in ("col_block_n", "col_block_m", "col_warps",
                                                    "col_stages")}  # fmt: skip
    cs, cm = torch.empty(1, hq, n, device=dev), torch.empty(1, hq, n, device=dev)
    out["general_ms"] = _ms(lambda: launch_general_columns(L, lse, cs, cm), rep)
    ref_sum, ref_mean = cs.clone(), cm.clone()
    Lc = prepared(q.contiguous(), k.contiguous())
    out["general_contiguous_ms"] = _ms(lambda: launch_general_columns(Lc, lse, cs, cm), rep)
    Lc = None  # frees the contiguous copies
    out["columns_ms"] = _ms(lambda: launch_columns(L, lse, cs, cm), rep)
    rel = ((cs - ref_sum).abs() / ref_sum.abs().clamp_min(1e-30)).max().item()
    out["col_sum_max_rel_diff_vs_general"] = rel
    out["col_mean_max_abs_diff_vs_general"] = (cm - ref_mean).abs().max().item()
    for t in tiles:
        bn, bm, w, s = map(int, t.replace("x", " ").replace("w", " ").replace("s", " ").split())
        cfg = dataclasses.replace(L.cfg, col_block_n=bn, col_block_m=bm, col_warps=w,
                                  col_stages=s)  # fmt: skip
        Lt = dataclasses.replace(L, cfg=cfg)
        out[f"columns_{t}_ms"] = _ms(lambda Lt=Lt: launch_columns(Lt, lse, cs, cm), rep)
    visible = hq * n * (n + 1) / 2
    qk = 2 * d * visible / mm_flops * 1e3
    ex = visible / _mufu_ex2_per_s(dev) * 1e3
    out["floor"] = {"qk_ms": qk, "exp_ms": ex, "overlapped_ms": max(qk, ex),
                    "serial_ms": qk + ex}  # fmt: skip
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, nargs="+", default=[65536, 131072])
    ap.add_argument("--heads", type=int, nargs=3, default=[32, 8, 128], help="hq hkv d")
    ap.add_argument("--tiles", nargs="*", default=[],
                    help="other column tiles to time, as KEYSxROWSwWARPSsSTAGES")  # fmt: skip
    args = ap.parse_args()
    hq, hkv, d = args.heads
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_flops = 2 * 8192**3 / (_ms(lambda: torch.mm(a, a), 200) * 1e-3)
    res = {
        "card": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shape": f"1 x {hq}q/{hkv}kv x d{d}, bf16, causal, [b, n, heads, d] memory",
        "matmul_tflops": mm_flops / 1e12,
        "layers": [layer(n, hq, hkv, d, args.tiles, mm_flops) for n in args.n],
    }
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
