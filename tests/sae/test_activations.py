"""Per-head outputs after each head's W_O slice."""

from __future__ import annotations

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.sae import activations


def _prompts(model, texts):
    return [model.encode(t) for t in texts]


def _o_proj_inputs_and_outputs(model, seqs):
    """Per layer, o_proj's own output on each sequence (an independent path through torch)."""
    outs = {}

    def grab(layer):
        def hook(_module, _inp, out):
            outs.setdefault(layer, []).append(out.detach())

        return hook

    handles = [m.o_proj.register_forward_hook(grab(i)) for i, m in enumerate(model.modules)]
    try:
        for s in seqs:
            model.forward(s[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return outs


@pytest.mark.parametrize("position", ["mean", "last"])
def test_heads_sum_to_the_attention_output(tiny, position):
    seqs = _prompts(tiny, ["the red gate is blue", "a city park on a sunny day", "the key"])
    x = activations.head_outputs(tiny, seqs, position=position, progress=False)
    L, H = tiny.n_layers, tiny.n_heads
    assert x.shape == (3, L * H, tiny.d_model)
    outs = _o_proj_inputs_and_outputs(tiny, seqs)
    for layer in range(L):
        for k in range(3):
            o = outs[layer][k][0]  # [n, d_model], o_proj has no bias in Llama
            want = o[1:].mean(0) if position == "mean" else o[-1]  # mean skips BOS
            got = x[k, layer * H : (layer + 1) * H].sum(0)
            assert torch.allclose(got, want, atol=1e-5)


def test_each_head_is_its_own_slice(tiny):
    # zero one head's slice of W_O: only that head's vector becomes zero
    seqs = _prompts(tiny, ["the red gate is blue"])
    before = activations.head_outputs(tiny, seqs, progress=False)
    w = tiny.modules[1].o_proj.weight
    saved = w.detach().clone()
    d = tiny.head_dim
    try:
        with torch.no_grad():
            w[:, 2 * d : 3 * d] = 0
        after = activations.head_outputs(tiny, seqs, progress=False)
    finally:
        with torch.no_grad():
            w.copy_(saved)
    H = tiny.n_heads
    assert after[0, H + 2].abs().max() == 0
    others = [i for i in range(2 * H) if i != H + 2]
    assert torch.allclose(after[0, others], before[0, others])


def test_batching_does_not_change_results(tiny):
    seqs = _prompts(tiny, ["the red gate", "the blue gate", "a green park is sunny", "it was"])
    one = activations.head_outputs(tiny, seqs, batch_size=1, progress=False)
    many = activations.head_outputs(tiny, seqs, batch_size=8, progress=False)
    assert torch.allclose(one, many, atol=1e-5)


def test_bad_input(tiny):
    with pytest.raises(HeadhuntError, match="position"):
        activations.head_outputs(tiny, _prompts(tiny, ["the"]), position="first")
    with pytest.raises(HeadhuntError, match="no sequences"):
        activations.head_outputs(tiny, [])
