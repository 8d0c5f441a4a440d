"""head_attention shows the model's own attention on every attention variant: sliding windows
(Mistral), logit softcapping with alternating sliding/full layers (Gemma 2) and learned sink
logits (gpt-oss), against transformers' eager attention of the same weights."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from headhunt import inspect as hi
from headhunt.probes.hooked import HookedModel
from headhunt.probes.tiny import tiny_causal_lm

LENGTH = 24  # longer than the tiny configs' sliding window, so the window bites


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("mistral", {"sliding_window": 8}),
        ("gemma2", {"sliding_window": 8}),
        ("gpt_oss", {"sliding_window": 8}),
    ],
)
def test_head_attention_equals_eager_attention_on_each_variant(family, overrides):
    model = tiny_causal_lm(family, **overrides)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    hooked = HookedModel(model=model, tokenizer=None, name=family)
    ids = torch.randint(3, 64, (LENGTH,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = eager(ids[None], output_attentions=True).attentions
    windowed = []
    for layer in range(len(ref)):
        for head in (0, ref[layer].shape[1] - 1):
            att = hi.head_attention(hooked, ids.tolist(), layer, head)
            want = ref[layer][0, head].numpy()
            np.testing.assert_allclose(att.probs, want, atol=2e-5, err_msg=f"{family} {layer}")
            windowed.append(bool((att.probs[-1, : LENGTH - 8] == 0).all()))
    # Some layer's window hides old keys from the last query (a plain causal softmax would not).
    assert any(windowed)
