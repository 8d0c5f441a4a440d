"""The head view (headhunt.probes.headview) at 128k tokens on a random 8B-shaped Llama (GPU).

Three steps, on two machines:

    # here (CPU): a 131,072-token prompt, the bundled haystack tokenized by SmolLM2's tokenizer,
    # with a passkey sentence at half depth and the question at the end
    python benchmarks/head_view_128k.py prepare --out hv_ids.npy
    # on the GPU: the view of one head, two exact rows checked against a one-row softmax
    python benchmarks/head_view_128k.py compute --ids hv_ids.npy --out DIR
    # here: decode the tokens into the saved view, for the dashboard's text panels
    python benchmarks/head_view_128k.py tokens --view DIR/head_view.npz --out FILE

The model's weights are random (Llama-3-8B's shape, bf16, seed 0, as bench_capture.py builds
it): the view shows what such a head does, nothing a trained model learned. The point is the
length: every array is 131,072 long and no 131,072 x 131,072 matrix exists anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

N = 131_072
NEEDLE = " The secret passkey for the blue vault is 482913. Remember it."
QUESTION = " What is the secret passkey for the blue vault? It is"


def prepare(out: str) -> None:
    from headhunt.heads.inputs.needles import read_haystack
    from headhunt.probes import load_model

    tok = load_model("smollm2-135m").tokenizer
    hay = tok(read_haystack(None), add_special_tokens=False).input_ids
    needle = tok(NEEDLE, add_special_tokens=False).input_ids
    question = tok(QUESTION, add_special_tokens=False).input_ids
    n_hay = N - 1 - len(needle) - len(question)
    body = (hay * (n_hay // len(hay) + 1))[:n_hay]
    half = n_hay // 2
    ids = [tok.bos_token_id or 0, *body[:half], *needle, *body[half:], *question]
    assert len(ids) == N
    np.save(out, np.asarray(ids, dtype=np.int32))
    print(f"{N} tokens, the needle at {1 + half}..{1 + half + len(needle)}")


def compute(ids_path: str, out: str, layer: int, head: int, tiny: bool = False) -> None:
    """``tiny``: a small random Llama on the CPU instead (a smoke test of this script)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from headhunt.probes.headview import head_view

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = torch.from_numpy(np.load(ids_path).astype(np.int64))
    n = len(ids)
    t0 = time.perf_counter()
    if tiny:
        from headhunt.probes.tiny import tiny_llama

        model = tiny_llama(vocab_size=50_000, max_context=n)
        cuda = False
    else:
        from bench_capture import llama8b

        model = llama8b("cuda")
        cuda = True
    model.max_context = max(model.max_context, n)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    built = time.perf_counter() - t0
    rows = sorted({n - 1, n // 2 + 100, int(n * 0.76), 4096 % n})
    card = torch.cuda.get_device_name() if cuda else "cpu (smoke test)"
    report: dict = {"card": card, "tokens": n, "layer": layer}
    report["head"] = head
    report["model"] = "tiny random Llama" if tiny else "random Llama-3-8B shape (bf16, seed 0)"
    before = torch.cuda.memory_allocated() if cuda else 0
    for rep in range(2):  # the first call compiles the Triton kernels
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        view = head_view(model, ids, layer, head, rows=rows, tokens=False)
        sync()
        report[f"seconds_call{rep + 1}"] = round(time.perf_counter() - t0, 2)
        if cuda:
            peak = torch.cuda.max_memory_allocated() - before
            report["peak_gib_above_weights"] = round(peak / 2**30, 2)
    report["seconds_build_model"] = round(built, 1)
    report["weights_gib"] = round(before / 2**30, 2)
    report["n_by_n_fp32_gib"] = round(n * n * 4 / 2**30, 1)
    report["computed"] = view.notes
    # Two exact rows against a plain one-row softmax of the same head's scores.
    report["row_check"] = check_rows(model, ids, layer, head, view, [n - 1, int(n * 0.76)])
    view.save(out_dir / "head_view.npz")
    (out_dir / "head_view_128k.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


def check_rows(model, ids, layer, head, view, queries) -> dict:
    """Each row again from the layer's q and k: scores of one query (n floats), softmax."""
    from headhunt.probes.capture import capture_qk

    q, k = capture_qk(model, ids[None], layers=[layer])[layer]
    kv = head // (q.shape[1] // k.shape[1])
    out = {}
    for i in queries:
        s = (q[0, head, i].float() @ k[0, kv, : i + 1].float().T) * q.shape[-1] ** -0.5
        p = torch.softmax(s, -1).cpu().numpy()
        got = view.row(i)
        out[str(i)] = {
            "max_abs_diff": float(np.abs(got[: i + 1] - p).max()),
            "future_mass": float(got[i + 1 :].sum()),
            "argmax_agrees": bool(int(p.argmax()) == int(view.argmax[i])),
        }
    return out


def tokens(view_path: str, out: str) -> None:
    from headhunt.probes import load_model
    from headhunt.probes.headview import HeadView

    tok = load_model("smollm2-135m").tokenizer
    view = HeadView.load(view_path)
    view.tokens = [tok.decode([int(i)]) for i in view.ids]
    view.notes["tokens_decoded_with"] = "smollm2-135m's tokenizer (the prompt was made with it)"
    view.save(out)
    print(f"{view.n} tokens decoded into {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", required=True)
    c = sub.add_parser("compute")
    c.add_argument("--ids", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--layer", type=int, default=15)
    c.add_argument("--head", type=int, default=0)
    c.add_argument("--tiny", action="store_true", help="a small CPU model (smoke test)")
    t = sub.add_parser("tokens")
    t.add_argument("--view", required=True)
    t.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.step == "prepare":
        prepare(a.out)
    elif a.step == "compute":
        compute(a.ids, a.out, a.layer, a.head, a.tiny)
    else:
        tokens(a.view, a.out)


if __name__ == "__main__":
    main()
