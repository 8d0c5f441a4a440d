"""What a head does on a bundled taskheads task, from its exact attention probabilities (short
prompts: the dense rows of ``AttentionCall.probs`` are small here): the share of each row's
mass on the previous token, on the first token (the sink) and on induction keys (the token
after an earlier copy of the row's own token: Olsson et al. 2022, "In-context learning and
induction heads"), averaged over every row past the first of each prompt.

Used to ask what the heads whose single ablation breaks a task (taskheads_single_heads.py) do
when none of taskheads' three detectors ranks them: those detectors read the answer rows'
attention to the evidence and the head's direct write to the answer logit, so a head that acts
only through later heads (a previous-token head feeding an induction head's keys) is invisible
to them.

    python benchmarks/taskheads_head_roles.py --model gemma3-270m --task kv --docs 10 \
        --examples 4 [--heads 4-1,5-1]
"""

from __future__ import annotations

import argparse

import torch

from headhunt.probes.attention import AttentionCall, AttentionHook


class RoleShares(AttentionHook):
    """Per layer, the [hq, 3] sums of previous-token, sink and induction mass over rows."""

    indexes_heads = False

    def __init__(self, ids: list[int]):
        ids_t = torch.tensor(ids)
        n = len(ids)
        # induction keys of row i: j <= i with ids[j - 1] == ids[i] (j >= 1)
        same = ids_t[None, :-1] == ids_t[:, None]  # [i, j - 1]
        ind = torch.zeros(n, n, dtype=torch.bool)
        ind[:, 1:] = same
        self.induction = ind & torch.ones(n, n, dtype=torch.bool).tril()
        self.sums: dict[int, torch.Tensor] = {}

    def after(self, call: AttentionCall, output):
        p = call.probs()[0].float().cpu()  # [hq, n, n]
        rows = torch.arange(1, p.shape[1])
        prev = p[:, rows, rows - 1].sum(-1)
        sink = p[:, rows, 0].sum(-1)
        ind = (p[:, 1:] * self.induction[1:].float()).sum((-1, -2))
        self.sums[call.layer] = torch.stack([prev, sink, ind], -1) / len(rows)
        return output


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--task", default="kv")
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--doc-words", type=int, default=40)
    ap.add_argument("--examples", type=int, default=4)
    ap.add_argument("--heads", default="", help="LAYER-HEAD,...: print only these")
    args = ap.parse_args()

    from headhunt.heads.inputs.task_inputs import Encoder, bundled
    from headhunt.probes.hooked import load_model

    model = load_model(args.model, device="cpu", dtype="float32")
    encoder = Encoder(model.tokenizer, model.max_context)
    total = None
    examples = bundled(args.task, args.examples, args.docs, args.doc_words, 0)
    for ex in examples:
        ids = encoder.encode(ex).ids
        hook = RoleShares(ids)
        with torch.inference_mode(), model.hooks(hook):
            model.forward(torch.tensor([ids]), use_cache=False, logits_to_keep=1)
        shares = torch.stack([hook.sums[la] for la in range(model.n_layers)])
        total = shares if total is None else total + shares
    total /= len(examples)
    want = {tuple(int(x) for x in h.split("-")) for h in args.heads.split(",") if h}
    print(f"{args.model} {args.task}: {len(examples)} prompts; head: previous-token / sink / "
          "induction share of each row's mass")  # fmt: skip
    for la in range(model.n_layers):
        cells = [f"{la}-{h} {total[la, h, 0]:.2f}/{total[la, h, 1]:.2f}/{total[la, h, 2]:.2f}"
                 for h in range(model.n_heads) if not want or (la, h) in want]  # fmt: skip
        if cells:
            print("  ".join(cells))


if __name__ == "__main__":
    main()
