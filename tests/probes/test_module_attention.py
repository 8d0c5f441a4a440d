"""Attention modules captured through their own code (probes/module_attention.py). That they
reproduce their own eager attention is the conformance suite's job (gpt_neo, mpt, bloom,
falcon); here: the refusals, Falcon's key heads, and that an unhooked model computes what it
computed before it was wrapped (Falcon's other two projection layouts too)."""

from __future__ import annotations

import copy

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.probes.hooked import HookedModel
from headhunt.probes.tiny import tiny_causal_lm

OVERRIDES = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": 4},
    # Falcon's two other layouts of its fused projection (the suite runs multi-query)
    "falcon-new": {"new_decoder_architecture": True, "num_kv_heads": 2},
    "falcon-mha": {"multi_query": False},
}


@pytest.mark.parametrize("family", ["gpt_neo", "mpt", "bloom", "falcon-new", "falcon-mha"])
def test_wrapped_model_computes_what_it_did(family):
    model = tiny_causal_lm(family.split("-")[0], **OVERRIDES.get(family, {}))
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


def test_falcon_multi_query_has_one_key_head():
    hooked = HookedModel(model=tiny_causal_lm("falcon"), tokenizer=None, name="falcon")
    assert (hooked.n_heads, hooked.n_kv_heads) == (4, 1)  # its config says num_kv_heads 4


@pytest.mark.parametrize(
    ("family", "overrides", "dtype", "words"),
    [
        ("bloom", {}, torch.bfloat16, "BLOOM rounds its ALiBi bias to torch.bfloat16"),
        (
            "falcon",
            {"alibi": True},
            torch.float32,
            "Falcon with ALiBi computes its bias in bfloat16",
        ),
    ],
)
def test_rounded_alibi_is_refused_in_one_line(family, overrides, dtype, words):
    model = tiny_causal_lm(family, **overrides).to(dtype)
    with pytest.raises(HeadhuntError) as err:
        HookedModel(model=model, tokenizer=None, name=family)
    assert "\n" not in str(err.value)
    assert words in str(err.value)


@pytest.mark.parametrize("family", ["gpt_neo", "mpt", "bloom", "falcon", "gpt_neox_japanese"])
def test_a_copy_routes_its_own_modules(family):
    # The routed methods are bound to their module: a deep copy (as prune-eval makes) computes
    # with its own weights. Zeroing the copy's attention output projections must move its
    # logits, and only its.
    model = tiny_causal_lm(family, **OVERRIDES.get(family, {}))
    hooked = HookedModel(model=model, tokenizer=None, name=family)
    twin = copy.deepcopy(hooked.model)
    for module in twin.modules():
        if getattr(module, "headhunt_adapted", False):
            for name in ("out_proj", "dense"):
                if isinstance(getattr(module, name, None), torch.nn.Linear):
                    torch.nn.init.zeros_(getattr(module, name).weight)
    ids = torch.randint(3, 64, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        moved = (twin(ids).logits - want).abs().max()
        again = (model(ids).logits - want).abs().max()
    assert moved > 1e-3 and again == 0
