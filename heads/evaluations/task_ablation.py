"""The causal check of task heads: ablate a detector's top-k heads and measure task accuracy.

Two ablations of a head's output (before the output projection, at every position):
``zero`` (the output is 0: :class:`headhunt.heads.interventions.masking.HeadMask` in "output" mode) and
``mean`` (the output is replaced by its mean over every position of a reference set of the
same task, as LOCOS does). Accuracy is greedy exact match of the gold answer, read from one
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

MODES = ("mean", "zero")


class MeanAblation(AttentionHook):
    """Replaces chosen heads' outputs by fixed means ([hq, d] per layer)."""

    def __init__(self, heads: Iterable[tuple[int, int]], means: dict[int, Tensor]):
        self.by_layer: dict[int, list[int]] = defaultdict(list)
        for layer, head in heads:
            self.by_layer[int(layer)].append(int(head))
        self.means = means

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        heads = self.by_layer.get(call.layer)
        if not heads:
            return output
        output = output.clone()
        mean = self.means[call.layer][heads].to(output.device, output.dtype)
        output[:, :, heads] = mean[None, None]
        return output


def ablation(heads: Sequence[tuple[int, int]], mode: str, means: dict[int, Tensor]):
    """The hook of one ablation (none for no heads)."""
    if not heads:
        return []
    if mode == "zero":
        return [HeadMask(heads, "output")]
    return [MeanAblation(heads, means)]


@torch.inference_mode()
def answers_right(
    model: HookedModel,
    sequences: Sequence[tuple[list[int], int]],
    hooks: Sequence[AttentionHook] = (),
) -> list[bool]:
    """For each (ids, answer start): whether greedy decoding reproduces ids[answer start:]."""
    out = []
    with model.hooks(*hooks):
        for ids, a0 in sequences:
            n = len(ids) - a0
            logits = model.forward(
                torch.tensor([ids], device=model.device), use_cache=False, logits_to_keep=n + 1
            ).logits[0, :n]
            gold = torch.tensor(ids[a0:], device=logits.device)
            out.append(bool((logits.argmax(-1) == gold).all()))
    return out
