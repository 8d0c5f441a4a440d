"""Hybrid models: only the attention layers are captured, under the model's own layer indices,
and a gated layer's hooks act on the gated head output its projection reads."""

from __future__ import annotations

import copy

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.heads.interventions.masking import mask_heads
from headhunt.probes.attention import AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.probes.tiny import tiny_causal_lm


@pytest.fixture(scope="module")
def qwen3_next():
    """Layer 0 is a gated delta net (linear attention), layer 1 gated softmax attention."""
    model = tiny_causal_lm("qwen3_next")
    eager = copy.deepcopy(model)
    return HookedModel(model=model, tokenizer=None, name="qwen3_next"), eager


def test_only_attention_layers_are_hooked_under_their_own_index(qwen3_next):
    hm, _ = qwen3_next
    assert hm.n_layers == 2 and hm.attention_layers == [1] and hm.is_hybrid
    assert hm.modules[0] is None and hm.modules[1].layer_idx == 1
    facts = hm.describe()
    assert facts["attention_layers"] == [1]
    assert facts["layer_kinds"] == ["linear_attention", "full_attention"]
    seen = []

    class Layers(AttentionHook):
        def before(self, call):
            seen.append(call.layer)

    with hm.hooks(Layers()):
        hm.forward(torch.tensor([[3, 4, 5, 6]]))
    assert seen == [1]


def test_a_layer_that_is_not_attention_is_refused_in_one_line(qwen3_next):
    hm, _ = qwen3_next
    refusal = "layer 0 \\(linear_attention\\) is not an attention"
    with pytest.raises(HeadhuntError, match=refusal), mask_heads(hm, [(0, 1)]):
        pass


def _projection_inputs(model, layer: int):
    """A pre-hook that records (and can change) what layer's o_proj reads."""
    attn = model.model.layers[layer].self_attn
    store = {}

    def hook(_mod, args):
        store["x"] = args[0].clone()
        change = store.get("change")
        return None if change is None else (change(args[0].clone()), *args[1:])

    return attn.o_proj.register_forward_pre_hook(hook), store


def test_gated_output_masking_and_replacement_act_after_the_gate(qwen3_next):
    """Masking a head's output (pruning) equals zeroing that head's slice of what the gated
    layer's o_proj reads; replacing it by a constant (mean ablation) puts that constant there,
    not the constant times the gate."""
    hm, eager = qwen3_next
    ids = torch.tensor([[3, 9, 4, 9, 4, 7, 3, 5]])
    d = hm.head_dim
    handle, store = _projection_inputs(eager, 1)
    try:
        with torch.no_grad():
            plain = eager(ids).logits
            store["change"] = lambda x: torch.cat(
                [x[..., :d], 0 * x[..., d : 2 * d], x[..., 2 * d :]], -1
            )
            ref_masked = eager(ids).logits
        with torch.no_grad(), mask_heads(hm, [(1, 1)], mode="output"):
            masked = hm.model(ids).logits
        torch.testing.assert_close(masked, ref_masked, atol=1e-5, rtol=1e-5)
        assert (masked - plain).abs().max() > 1e-4

        class Constant(AttentionHook):
            def after(self, call, output):
                output = output.clone()
                output[:, :, 1] = 0.5
                return output

        store["change"] = None
        handle2, seen = _projection_inputs(hm.model, 1)
        try:
            with torch.no_grad(), hm.hooks(Constant()):
                hm.model(ids)
        finally:
            handle2.remove()
        assert torch.equal(
            seen["x"][..., d : 2 * d], torch.full_like(seen["x"][..., d : 2 * d], 0.5)
        )
    finally:
        handle.remove()
