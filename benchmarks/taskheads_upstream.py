"""Does a head that no taskheads detector ranks act through the copy heads? Mean-ablate one
head at a time (the method's own ablation, means over the first --reference examples of the
task) and read, at each evaluation example's first answer row, the exact attention mass that
chosen later heads put on the evidence document and on its keys holding the first answer
token, with the task accuracy (greedy exact match).

Gemma 3 270M's previous-token heads 4-1 and 10-1 sit in the sliding layers just before the
global layers 5 and 11, whose heads 5-1 and 11-2 are the copy detector's top two; if they are
the previous-token halves of induction circuits (Olsson et al. 2022, "In-context learning and
induction heads"), ablating them takes the copy heads' attention off the evidence.

    python benchmarks/taskheads_upstream.py --model gemma3-270m --task kv --docs 10 \
        --ablate 4-1,10-1,4-3,2-3 --read 5-1,5-2,11-2
"""

from __future__ import annotations

import argparse

import torch

from headhunt.probes.attention import AttentionCall, AttentionHook


def _heads(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in h.split("-")) for h in text.split(",") if h]


class EvidenceMass(AttentionHook):
    """The attention mass of chosen heads from one row onto a key span (``mass``) and onto the
    keys of that span that hold a given token (``on_token``: what Wu et al.'s copy rule asks
    the head to attend to)."""

    def __init__(self, heads, row: int, span: tuple[int, int], ids: list[int], token: int):
        self.heads, self.row, self.span = heads, row, span
        self.holds = torch.tensor([i == token for i in ids[span[0] : span[1]]])
        self.mass: dict[tuple[int, int], float] = {}
        self.on_token: dict[tuple[int, int], float] = {}

    def after(self, call: AttentionCall, output):
        hs = [h for la, h in self.heads if la == call.layer]
        if hs:
            p = call.probs(slice(self.row, self.row + 1), hs)[0, :, 0]  # [len(hs), nk]
            for h, row in zip(hs, p, strict=True):
                span = row[self.span[0] : self.span[1]].cpu()
                self.mass[(call.layer, h)] = float(span.sum())
                self.on_token[(call.layer, h)] = float(span[self.holds].sum())
        return output


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--task", default="kv")
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--doc-words", type=int, default=40)
    ap.add_argument("--reference", type=int, default=16)
    ap.add_argument("--examples", type=int, default=16)
    ap.add_argument("--ablate", default="4-1,10-1,4-3,2-3")
    ap.add_argument("--read", default="5-1,5-2,11-2")
    args = ap.parse_args()

    from headhunt.heads.evaluations.task_ablation import ablation, answers_right, reference_means
    from headhunt.heads.inputs.task_inputs import Encoder, bundled
    from headhunt.probes.hooked import load_model

    model = load_model(args.model, device="cpu", dtype="float32")
    encoder = Encoder(model.tokenizer, model.max_context)
    n = args.reference + args.examples
    encoded = [encoder.encode(ex) for ex in bundled(args.task, n, args.docs, args.doc_words, 0)]
    means = reference_means(model, [e.ids for e in encoded[: args.reference]])
    evals = encoded[args.reference :]
    read = _heads(args.read)
    print(f"{args.model} {args.task}: {len(evals)} examples (means over {args.reference}); "
          "accuracy, then each read head's attention mass on the evidence document at the "
          "first answer row (in brackets: on its keys that hold the first answer token)")  # fmt: skip
    for heads in [[], *([h] for h in _heads(args.ablate))]:
        hooks = ablation(heads, "mean", means)
        right = answers_right(model, [(e.ids, e.answer_start) for e in evals], hooks)
        mass = {h: [0.0, 0.0] for h in read}
        for e in evals:
            a0 = e.answer_start
            probe = EvidenceMass(read, a0 - 1, e.doc_spans[e.evidence[0]], e.ids, e.ids[a0])
            with torch.inference_mode(), model.hooks(*hooks, probe):
                model.forward(torch.tensor([e.ids]), use_cache=False, logits_to_keep=1)
            for h in read:
                mass[h][0] += probe.mass[h] / len(evals)
                mass[h][1] += probe.on_token[h] / len(evals)
        name = "none" if not heads else f"{heads[0][0]}-{heads[0][1]}"
        cells = "  ".join(f"{la}-{h} {m:.3f} ({t:.3f})" for (la, h), (m, t) in mass.items())
        print(f"ablated {name:>5}: accuracy {sum(right) / len(right):.2f}  {cells}", flush=True)


if __name__ == "__main__":
    main()
