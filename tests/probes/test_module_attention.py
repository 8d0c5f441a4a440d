"""Attention modules captured through their own code (probes/module_attention.py). That they
reproduce their own eager attention is the conformance suite's job (gpt_neo, mpt, bloom); here:
the refusals and that an unhooked model computes what it computed before it was wrapped."""

from __future__ import annotations

import copy

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.probes.hooked import HookedModel
from headhunt.probes.tiny import tiny_causal_lm


@pytest.mark.parametrize("family", ["gpt_neo", "mpt", "bloom"])
def test_wrapped_model_computes_what_it_did(family):
    overrides = {"attention_types": [[["global", "local"], 1]], "window_size": 4}
    model = tiny_causal_lm(family, **(overrides if family == "gpt_neo" else {}))
    before = copy.deepcopy(model).eval()
    hooked = HookedModel(model=model, tokenizer=None, name=family)
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        want = before(ids, attention_mask=mask).logits
        got = hooked.model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)
    assert hooked.attention_layers == [0, 1]


def test_bloom_below_float32_is_refused_in_one_line():
    model = tiny_causal_lm("bloom").to(torch.bfloat16)
    with pytest.raises(HeadhuntError) as err:
        HookedModel(model=model, tokenizer=None, name="bloom")
    assert "\n" not in str(err.value)
    assert "rounds its ALiBi bias to torch.bfloat16" in str(err.value)
