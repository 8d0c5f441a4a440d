"""All three task-head scores (copy, query focus, write) for one 128k-token example on a random
8B-shaped Llama, timed against a plain forward of the same tokens (one GPU).

    python benchmarks/taskheads_128k.py --out DIR            # on the GPU
    python benchmarks/taskheads_128k.py --out DIR --tiny     # CPU smoke test of this script

The example is random token ids laid out as the method lays out a prompt: BOS, 32 documents of
equal length (one is the evidence), a 24-token question, 6 frame tokens and a 4-token answer
fed by teacher forcing; the null prompt replaces the question by 3 tokens. The weights are
random (Llama-3-8B's shape, bf16, seed 0, as bench_capture.py builds it), so the scores say
nothing about a trained model: the point is the length and the cost. ``score_example`` (as
for an evaluation example: with 16 retriever heads) runs the documents once (a prefix pass
filling the KV cache, then the teacher-forced suffix with the capture and the null suffix on
that cache); its time is set against one plain forward of the full sequence. Times are medians of ``--repeats`` calls after one warm-up call each (Triton
compiles there), plain forward and scores in the same process on the same card.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

N = 131_072
DOCS, QUESTION, FRAME, ANSWER, NULL = 32, 24, 6, 4, 3


def example(n: int, vocab: int):
    from headhunt.heads.inputs.task_inputs import Encoded

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, vocab, (n,), generator=g).tolist()
    body = n - 1 - QUESTION - FRAME - ANSWER
    size = body // DOCS
    spans = [(1 + i * size, 1 + (i + 1) * size) for i in range(DOCS)]
    q0 = spans[-1][1]
    ids = ids[: q0 + QUESTION + FRAME + ANSWER]
    # the answer's tokens also stand in the evidence document, so copy has something to find
    ev = DOCS // 3
    ids[spans[ev][0] + 100 : spans[ev][0] + 100 + ANSWER] = ids[-ANSWER:]
    after = ids[q0 + QUESTION : q0 + QUESTION + FRAME]
    null = ids[:q0] + list(range(500, 500 + NULL)) + after
    return Encoded(
        id="random-128k",
        ids=ids,
        null_ids=null,
        doc_spans=spans,
        evidence=[ev],
        question=(q0, q0 + QUESTION),
        null_question=(q0, q0 + NULL),
        answer_start=len(ids) - ANSWER,
    )


def timed(fn, sync, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), [round(t, 3) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls after the warm-up")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from headhunt.heads.taskheads import score_example

    if a.tiny:
        from headhunt.probes.tiny import tiny_llama

        n, model, sync = 4096, tiny_llama(vocab_size=5000, max_context=4096), lambda: None
        card = "cpu (smoke test)"
    else:
        from bench_capture import llama8b

        n, model, sync = N, llama8b("cuda"), torch.cuda.synchronize
        card = torch.cuda.get_device_name()
    model.max_context = max(model.max_context, n)
    enc = example(n, model.vocab_size)
    ids = torch.tensor([enc.ids], device=model.device)
    from headhunt.heads.taskheads import shared_prefix

    report = {"card": card, "tokens": len(enc.ids), "model": model.name,
              "null_pass_on_the_documents_cache": True, "prefix_tokens": shared_prefix(enc),
              "repeats": a.repeats}  # fmt: skip

    def plain():
        with torch.inference_mode():
            model.forward(ids, use_cache=False, logits_to_keep=1)

    result = {}

    # an evaluation example's pass also scores the documents with the retriever's 16 heads
    heads = [(la, la % model.n_heads) for la in range(0, model.n_layers, 2)][:16]
    report["retriever_heads"] = len(heads)

    def scores():
        result["r"] = score_example(model, enc, retriever_heads=heads)

    report["plain_forward_s"], report["plain_calls_s"] = timed(plain, sync, a.repeats)
    if not a.tiny:
        torch.cuda.reset_peak_memory_stats()
    report["scores_s"], report["scores_calls_s"] = timed(scores, sync, a.repeats)
    if not a.tiny:
        report["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    report["scores_over_one_forward"] = round(report["scores_s"] / report["plain_forward_s"], 3)
    r = result["r"]
    report["evidence_copy_heads"] = int((r.copy > 0).sum())
    arrays = (r.mass, r.null_mass, r.focus, r.focus_all, r.focus_top, r.write_evidence,
              r.write_off)  # fmt: skip
    report["finite"] = bool(all(torch.isfinite(torch.tensor(x)).all() for x in arrays))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "taskheads_128k.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
