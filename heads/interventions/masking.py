"""Head masking (pruning) as a reusable intervention."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Literal

import torch

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.scores import check_heads

MaskMode = Literal["query", "output"]


class HeadMask(AttentionHook):
    """Masks chosen query heads.

    Modes:
        "query": zero the head's query, so all its scores become 0: its attention becomes
            uniform over the keys it may see (Wu et al.'s masking on the flash path; their eager
            path zeroes the scores, which is the same distribution). The model's kernel still
            applies everything else (mask, window, softcap, learned sinks: with a sink the keys
            share what the sink leaves), since the hook only changes the query.
        "output": zero the head's output before the output projection (pruning).
    """

    def __init__(self, heads: Iterable[tuple[int, int]], mode: MaskMode = "query"):
        if mode not in ("query", "output"):
            raise HeadhuntError(f"unknown mask mode {mode!r} (use query or output)")
        self.mode = mode
        self.by_layer: dict[int, list[int]] = defaultdict(list)
        for layer, head in heads:
            self.by_layer[int(layer)].append(int(head))

    def layers(self) -> list[int]:
        return sorted(self.by_layer)

    def before(self, call: AttentionCall) -> None:
        heads = self.by_layer.get(call.layer)
        if heads and self.mode == "query":
            q = call.query.clone()
            q[:, heads] = 0
            call.query = q

    def after(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        heads = self.by_layer.get(call.layer)
        if heads and self.mode == "output":
            output = output.clone()
            output[:, :, heads] = 0
        return output


@contextlib.contextmanager
def mask_heads(
    model: HookedModel, heads: Iterable[tuple[int, int]], mode: MaskMode = "query"
) -> Iterator[HeadMask]:
    """Mask ``heads`` ((layer, query head) pairs) inside the block, in prefill and decoding.

    Example:
        >>> with mask_heads(model, [(14, 3), (20, 1)]):
        ...     model.forward(ids)
    """
    hook = HeadMask(check_heads(heads, model.n_layers, model.n_heads), mode)
    with model.hooks(hook, layers=sorted(hook.by_layer)):
        yield hook
