"""The causal check of task heads: ablate a detector's top-k heads and measure task accuracy.

Three ablations of a head's output (before the output projection): ``zero`` (the output is 0
at every position: :class:`headhunt.heads.interventions.masking.HeadMask` in "output" mode),
``mean`` (at every position the output is replaced by its mean over every position of a
reference set of the same task, as LOCOS does) and ``mean-keep-first`` (the same at every
position but the first, whose output is kept; the mean is over the reference set's positions
but the first). The first token is the attention sink (Xiao et al. 2023, arXiv 2309.17453):
most heads put most of their mass on it, and its residual is unlike every other position's
(Sun et al. 2024, arXiv 2402.17762, massive activations), so a mean taken over the task's
positions is far from what a head writes there; ``mean-keep-first`` measures how much of a
mean ablation's damage comes from that one position. Accuracy is greedy exact match of the gold answer, read from one
teacher-forced pass (the answer is reproduced by greedy decoding exactly when every answer
token is its row's argmax). Each top-k set is compared with random sets of k heads and with
closed-book prompts the full model answers without any context (the specificity control).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from headhunt.heads.interventions.masking import HeadMask
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel

MODES = ("mean", "mean-keep-first", "zero")


class MeanAblation(AttentionHook):
    """Replaces chosen heads' outputs by fixed means ([hq, d] per layer), at every position
    from ``start`` on (1: the first position's output is kept)."""

    def __init__(self, heads: Iterable[tuple[int, int]], means: dict[int, Tensor], start: int = 0):
        self.by_layer: dict[int, list[int]] = defaultdict(list)
        for layer, head in heads:
            self.by_layer[int(layer)].append(int(head))
        self.means = means
        self.start = start

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        heads = self.by_layer.get(call.layer)
        if not heads:
            return output
        output = output.clone()
        mean = self.means[call.layer][heads].to(output.device, output.dtype)
        output[:, self.start :, heads] = mean[None, None]
        return output


def mean_outputs(total, first, count: int, sequences: int) -> dict[str, dict[int, Tensor]]:
    """The per-layer means ([hq, d]) a mean ablation puts in, from sums over a reference set
    (``total``/``first``: [layer, hq, d] arrays summed over every position / the first ones,
    ``count`` positions in ``sequences`` sequences): ``mean`` over every position,
    ``mean-keep-first`` over every position but the first of each sequence."""
    import numpy as np

    total, first = np.asarray(total), np.asarray(first)
    rest = (total - first) / (count - sequences)
    return {
        mode: {la: torch.tensor(m[la], dtype=torch.float32) for la in range(len(m))}
        for mode, m in (("mean", total / count), ("mean-keep-first", rest))
    }


@torch.inference_mode()
def reference_means(
    model: HookedModel, sequences: Sequence[Sequence[int]]
) -> dict[str, dict[int, Tensor]]:
    """:func:`mean_outputs` over a reference set of token sequences (one forward each)."""
    import numpy as np

    from headhunt.heads.taskheads import OutputSum

    sums = OutputSum()
    with model.hooks(sums):
        for ids in sequences:
            model.forward(torch.tensor([list(ids)], device=model.device), use_cache=False,
                          logits_to_keep=1)  # fmt: skip
    layers = range(model.n_layers)
    total = np.stack([sums.total[la].numpy() for la in layers])
    first = np.stack([sums.first[la].numpy() for la in layers])
    return mean_outputs(total, first, sums.count, len(sequences))


def ablation(heads: Sequence[tuple[int, int]], mode: str, means: dict[str, dict[int, Tensor]]):
    """The hook of one ablation (none for no heads); ``means[mode]``: the per-layer means."""
    if not heads:
        return []
    if mode == "zero":
        return [HeadMask(heads, "output")]
    return [MeanAblation(heads, means[mode], start=1 if mode == "mean-keep-first" else 0)]


@torch.inference_mode()
def answers_right(
    model: HookedModel,
    sequences: Sequence[tuple[list[int], int]],
    hooks: Sequence[AttentionHook] = (),
    batch_size: int = 1,
) -> list[bool]:
    """For each (ids, answer start): whether greedy decoding reproduces ids[answer start:].

    Sequences go ``batch_size`` at a time, padded on the right: under causal attention a
    token never sees the padding after it, so each sequence's rows are its own (no attention
    mask needed, positions unchanged). Only the answer rows go through the output embedding.
    """
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    out: dict[int, bool] = {}
    decoder = model.model.get_decoder()
    unembed = model.model.get_output_embeddings()
    with model.hooks(*hooks):
        for b in range(0, len(order), batch_size):
            batch = [sequences[i] for i in order[b : b + batch_size]]
            width = max(len(ids) for ids, _ in batch)
            ids = torch.tensor([s + [s[-1]] * (width - len(s)) for s, _ in batch],
                               device=model.device)  # fmt: skip
            hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
            for row, (i, (seq, a0)) in enumerate(zip(order[b : b + batch_size], batch,
                                                     strict=True)):  # fmt: skip
                # Row t predicts token t + 1; the argmax is the same before a logit softcap.
                logits = unembed(hidden[row, a0 - 1 : len(seq) - 1])
                gold = torch.tensor(seq[a0:], device=logits.device)
                out[i] = bool((logits.argmax(-1) == gold).all())
    return [out[i] for i in range(len(sequences))]
