"""Helpers of the conformance suite: a tiny model of a family next to its own eager copy, a
left-padded batch that runs past the sliding window / attention chunk, and the model's eager
attention with chosen heads' queries zeroed (the reference for head masking)."""

from __future__ import annotations

import copy
import signal
import sys
from dataclasses import dataclass

import pytest
import torch

BATCH, LENGTH, PAD = 2, 20, 5  # row 0 is left-padded by PAD tokens; window / chunk = 8
MASKED_HEAD = (1, 1)  # (layer, query head) zeroed by the masking check
REFERENCE = "conformance_eager_qmask"
_ZEROED: dict[int, list[int]] = {}  # layer -> query heads whose queries the reference zeroes


@dataclass
class Pair:
    hooked: object  # HookedModel (headhunt's attention, the model's SDPA/eager kernel)
    eager: torch.nn.Module  # the same weights, transformers' eager attention, no headhunt


def build_pair(family: str) -> Pair:
    """The family's tiny model wrapped by headhunt, and an untouched eager copy."""
    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm

    with time_limit(60, family):
        model = tiny_causal_lm(family)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    return Pair(HookedModel(model=model, tokenizer=None, name=family), eager)


class time_limit:
    """Fail instead of hanging (some families' defaults build very large towers)."""

    def __init__(self, seconds: int, what: str):
        self.seconds, self.what = seconds, what

    def __enter__(self):
        def fail(*_):
            raise TimeoutError(f"building {self.what} took over {self.seconds} s")

        self.old = signal.signal(signal.SIGALRM, fail)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)


def padded_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [BATCH, LENGTH] (avoiding the pad/bos/eos ids 0-2) and their mask, row 0
    left-padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (BATCH, LENGTH), generator=g)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[0, :PAD] = 0
    ids[0, :PAD] = 0
    return ids, mask


def _reference_attention(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention, with the queries of ``_ZEROED`` heads set to zero."""
    heads = _ZEROED.get(module.layer_idx)
    if heads:
        query = query.clone()
        query[:, heads] = 0
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, attention_mask, **kwargs)


@pytest.fixture(scope="session")
def zeroed():
    """A context manager (eager model, heads) that zeroes those heads' queries."""
    return zeroed_query_reference()


def zeroed_query_reference():
    """Register the masking reference; return a context manager (eager model, heads)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(REFERENCE, _reference_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(REFERENCE, eager_mask)

    class zeroed:
        def __init__(self, model, heads: list[tuple[int, int]]):
            self.model, self.heads = model, heads

        def __enter__(self):
            for layer, head in self.heads:
                _ZEROED.setdefault(layer, []).append(head)
            self.model.set_attn_implementation(REFERENCE)

        def __exit__(self, *exc):
            _ZEROED.clear()
            self.model.set_attn_implementation("eager")

    return zeroed
