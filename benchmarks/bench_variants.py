"""Benchmark the attention variants of headhunt.kernels (sliding window, softcap, sink
logits, left padding) against today's causal path, SDPA and flex attention.

Run on a CUDA machine::

    python benchmarks/bench_variants.py --out variants.json

For each head layout and length, on the same random bf16 q, k (v for SDPA / flex), it
times (``triton.testing.do_bench`` medians after warm-up, CUDA events):

* ``stats``: our Triton statistics (pass 1: lse, max, argmax; pass 2: col_sum, col_mean)
  with the variant's options; ``row``: pass 1 alone;
* ``flex``: ``torch.nn.attention.flex_attention`` (compiled) forward with the same mask
  (a block mask) and score_mod (softcap), returning the lse: the fastest public kernel
  that runs these masks, and the one a user would reach for;
* ``sdpa``: causal SDPA (flash) for scale; it has no window, softcap or sink option.

``ns/score`` divides time by the number of visible (query, key) pairs, so a window's
cost can be compared with the causal path's per unit of work; the issue 14 goal is that
a variant costs no more than 1.1x the causal path (same time for softcap and sinks, the
same rate per visible score for windows).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from bench_kernels import _time, environment  # benchmarks/ is on the path when run as a script

# label: (query heads, kv heads, head dim, window): Mistral/Llama 3 8B-like, gpt-oss-like
# (window 128, sinks), Gemma 2 9B-like (window 4096, softcap 50, d 256).
LAYOUTS = {
    "32q8kv-d128": (32, 8, 128, 4096),
    "64q8kv-d64": (64, 8, 64, 128),
    "16q8kv-d256": (16, 8, 256, 4096),
}
SOFTCAP = 50.0


def _visible(n: int, window: int | None, pad: int = 0) -> float:
    """Visible (query, key) pairs of a causal n x n mask with a window / left padding."""
    m = n - pad
    if window is None:
        return m * (m + 1) / 2
    w = min(window, m)
    return w * m - w * (w - 1) / 2


def _flex(q, k, v, *, window: int | None, softcap: float | None, pad: int = 0):
    """A compiled flex_attention call (output and lse) with the variant's mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, qi, ki):
        ok = (ki <= qi) & (ki >= pad)
        if window is not None:
            ok = ok & (ki > qi - window)
        return ok

    score_mod = None
    if softcap is not None:

        def score_mod(score, b, h, qi, ki):
            return softcap * torch.tanh(score / softcap)

    n = q.shape[2]
    mask = create_block_mask(mask_mod, None, None, n, n, device=q.device)
    fn = torch.compile(flex_attention)
    return lambda: fn(
        q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=True, return_lse=True
    )


def bench(layout: str, n: int, rep_ms: int, flex: bool) -> list[dict]:
    """Rows for one layout and length: every variant, ours and flex, plus causal SDPA."""
    import torch.nn.functional as F

    from headhunt.kernels import attention_stats

    hq, hkv, d, window = LAYOUTS[layout]
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    q = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    sinks = torch.randn(hq, device="cuda", generator=gen)
    pad = n // 8
    key_lo = torch.full((1, n), pad, device="cuda", dtype=torch.int64)
    variants = {
        "causal": ({}, None, None, 0),
        "causal-again": ({}, None, None, 0),  # the spread between two identical timings
        "window": (dict(window=window), window, None, 0),
        "softcap": (dict(softcap=SOFTCAP), None, SOFTCAP, 0),
        # Scores up to ~4x larger (q scaled by 10): most tiles have some score past half
        # the cap and take the exp2-based tanh instead of the polynomial.
        "softcap-large": (dict(softcap=SOFTCAP), None, SOFTCAP, 0),
        "sinks": (dict(sinks=sinks), None, None, 0),
        "window+sinks": (dict(window=window, sinks=sinks), window, None, 0),
        "leftpad": (dict(key_lo=key_lo), None, None, pad),
    }
    rows = []
    base = {"layout": layout, "n": n, "hq": hq, "hkv": hkv, "d": d}
    sdpa_ms = _time(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), rep_ms
    )
    for name, (kw, win, cap, pd) in variants.items():
        row = {**base, "variant": name, "window": win, "sdpa_causal_ms": sdpa_ms}
        row["visible_scores"] = hq * _visible(n, win, pd)
        qv = q * 10.0 if name == "softcap-large" else q
        try:
            row["stats_ms"] = _time(lambda kw=kw, qv=qv: attention_stats(qv, k, **kw), rep_ms)
            row["row_ms"] = _time(
                lambda kw=kw, qv=qv: attention_stats(qv, k, key_stats=False, **kw), rep_ms
            )
        except Exception as e:  # e.g. a tile config that does not fit at d = 256
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if flex and "sinks" not in name and name != "causal-again":
            try:
                fn = _flex(qv, k, v, window=win, softcap=cap, pad=pd)
                fn()
                row["flex_ms"] = _time(fn, rep_ms)
            except Exception as e:
                row["flex_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        for key in ("stats_ms", "row_ms", "flex_ms"):
            if key in row:
                row[key.replace("_ms", "_ns_per_score")] = row[key] * 1e6 / row["visible_scores"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    causal = rows[0]
    for row in rows:
        for key in ("stats", "row"):
            if f"{key}_ms" in row and f"{key}_ms" in causal:
                row[f"{key}_over_causal"] = row[f"{key}_ms"] / causal[f"{key}_ms"]
                row[f"{key}_rate_over_causal"] = (
                    row[f"{key}_ns_per_score"] / causal[f"{key}_ns_per_score"]
                )
    return rows


# (layout, queries, keys) of the decode-shaped cases.
DECODE_CASES = [
    ("32q8kv-d128", 1, 32768),
    ("32q8kv-d128", 1, 65536),
    ("32q8kv-d128", 1, 131072),
    ("32q8kv-d128", 4, 131072),
    ("64q8kv-d64", 1, 131072),
]


def bench_decode_case(layout: str, nq: int, nk: int, rep_ms: int) -> dict:
    """Few queries over a long cache: row statistics by the split-K decode kernels, by
    the row kernel (the path before them), and SDPA decode (flash, same q, k and a v)."""
    import torch.nn.functional as F

    from headhunt.kernels.launch import attention_stats_triton

    hq, hkv, d, _ = LAYOUTS[layout]
    gen = torch.Generator(device="cuda").manual_seed(nk + nq)
    q = torch.randn(1, hq, nq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, hkv, nk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, hkv, nk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    row = {"layout": layout, "nq": nq, "nk": nk, "hq": hq, "hkv": hkv, "d": d}
    fns = {
        "decode": lambda: attention_stats_triton(q, k, key_stats=False, decode=True),
        "decode_entropy": lambda: attention_stats_triton(
            q, k, key_stats=False, entropy=True, decode=True
        ),
        "row_kernel": lambda: attention_stats_triton(q, k, key_stats=False, decode=False),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    }
    for name, fn in fns.items():
        row[f"{name}_ms"] = _time(fn, rep_ms)
    # K read once (bf16) at the card's copy bandwidth is the floor for the statistics.
    row["k_bytes"] = k.numel() * k.element_size()
    row["decode_over_sdpa"] = row["decode_ms"] / row["sdpa_ms"]
    row["row_kernel_over_sdpa"] = row["row_kernel_ms"] / row["sdpa_ms"]
    print(json.dumps(row), flush=True)
    return row


def _copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write), 1 GiB."""
    x = torch.empty(2**29, dtype=torch.float16, device="cuda")
    y = torch.empty_like(x)
    ms = _time(lambda: y.copy_(x), 100)
    return 2 * x.numel() * x.element_size() / (ms * 1e-3)


def decode_markdown(rows: list[dict], bw: float) -> str:
    lines = [
        "| layout | queries | keys | split-K ms | + entropy ms | row kernel ms | SDPA ms "
        "| split-K / SDPA | row kernel / SDPA | K-read floor ms |",
        "|" + " --- |" * 10,
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['nq']} | {r['nk'] // 1024}k | {r['decode_ms']:.3f} "
            f"| {r['decode_entropy_ms']:.3f} | {r['row_kernel_ms']:.3f} | {r['sdpa_ms']:.3f} "
            f"| {r['decode_over_sdpa']:.2f} | {r['row_kernel_over_sdpa']:.2f} "
            f"| {r['k_bytes'] / bw * 1e3:.3f} |"
        )
    return "\n".join(lines)


def _fmt(x, spec: str = ".2f") -> str:
    return format(x, spec) if isinstance(x, float) else "-"


def markdown(rows: list[dict]) -> str:
    """Markdown table of the rows."""
    lines = [
        "| layout | n | variant | stats ms | row ms | flex fwd ms | causal SDPA ms "
        "| stats / causal | stats ns/score over causal | row / causal |",
        "|" + " --- |" * 10,
    ]
    for r in rows:
        lines.append(
            f"| {r['layout']} | {r['n'] // 1024}k | {r['variant']} | {_fmt(r.get('stats_ms'))} "
            f"| {_fmt(r.get('row_ms'))} | {_fmt(r.get('flex_ms'))} | {_fmt(r['sdpa_causal_ms'])} "
            f"| {_fmt(r.get('stats_over_causal'))} | {_fmt(r.get('stats_rate_over_causal'))} "
            f"| {_fmt(r.get('row_over_causal'))} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file for all results")
    p.add_argument("--cases", default="32q8kv-d128:16384,32q8kv-d128:65536,64q8kv-d64:16384")
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench repetition time")
    p.add_argument("--no-flex", action="store_true", help="skip flex attention")
    p.add_argument("--decode", action="store_true", help="also time decode-shaped cases")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_variants needs a CUDA device", file=sys.stderr)
        return 2
    result: dict = {
        **environment(),
        "softcap": SOFTCAP,
        "rows": [],
    }
    if args.decode:
        result["copy_bytes_per_s"] = _copy_bandwidth()
        result["decode_rows"] = [bench_decode_case(*c, args.rep_ms) for c in DECODE_CASES]
        args.out.write_text(json.dumps(result, indent=1))
    for case in filter(None, args.cases.split(",")):
        layout, n = case.split(":")
        result["rows"] += bench(layout, int(n), args.rep_ms, not args.no_flex)
        args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{result['device']}, torch {result['torch']}, triton {result['triton']}\n")
    if args.decode:
        print(decode_markdown(result["decode_rows"], result["copy_bytes_per_s"]))
    print(markdown(result["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
