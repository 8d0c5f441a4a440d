"""Activation patching (ground truth) and attribution patching, checked against planted heads
and against a patch done by hand."""

from __future__ import annotations

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionHook
from headhunt.sae import patching
from headhunt.sae.planted import planted_model
from headhunt.sae.prompt_pairs import PromptPair, encode_pairs, make_pairs


@pytest.fixture(scope="module")
def planted():
    return planted_model()


def test_logit_diff_with_answer_sets():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])
    got = patching.logit_diff(logits, [[3], [0, 1]], [[0], [3]])
    assert torch.allclose(got[0], torch.tensor(3.0))
    assert torch.allclose(got[1], torch.logsumexp(torch.tensor([3.0, 2.0]), 0) - 0.0)


def test_patching_finds_only_the_planted_heads(planted):
    pairs = planted.pairs(6, seed=1)
    res = patching.activation_patching(planted.model, pairs, batch_size=4, progress=False)
    assert res.shortcut
    assert res.clean_metric > res.corrupt_metric + 1
    for layer in range(planted.model.n_layers):
        for head in range(planted.model.n_heads):
            e = float(res.effect[layer, head])
            if (layer, head) in planted.heads:
                assert e > 1
            else:  # every other head computes the same thing on both prompts
                assert abs(e) < 1e-4
    full = patching.activation_patching(planted.model, pairs, shortcut=False, progress=False)
    assert not full.shortcut
    assert torch.allclose(full.effect, res.effect, atol=1e-4)


def test_attribution_patching_finds_the_planted_heads(planted):
    pairs = planted.pairs(6, seed=2)
    eap = patching.attribution_patching(planted.model, pairs)
    per = patching.attribution_patching(planted.model, pairs, per_pair=True, batch_size=2)
    assert per.shape == (6, *eap.shape)
    assert torch.allclose(per.mean(0), eap, atol=1e-4)
    flat = eap.abs().flatten()
    top = {divmod(int(i), planted.model.n_heads) for i in flat.topk(len(planted.heads)).indices}
    assert top == set(planted.heads)
    mask = torch.ones_like(eap, dtype=torch.bool)
    for layer, head in planted.heads:
        mask[layer, head] = False
    assert eap[mask].abs().max() < 1e-4


class _ManualPatch(AttentionHook):
    def __init__(self, layer, head, clean):
        self.layer, self.head, self.clean = layer, head, clean

    def after(self, call, output):
        if call.layer == self.layer:
            output = output.clone()
            output[:, :, self.head] = self.clean
        return output


def test_patching_matches_a_patch_by_hand(tiny):
    pairs = encode_pairs(
        tiny.tokenizer,
        [
            PromptPair("the red gate is", "the blue gate is", [" lamp"], [" river"]),
            PromptPair("a city park was", "a sunny park was", [" bread", " key"], [" day"]),
        ],
        require_aligned=True,
    )
    res = patching.activation_patching(tiny, pairs, progress=False)
    assert res.shortcut
    for layer, head in [(0, 1), (1, 3)]:
        effects = []
        for k in range(2):
            pos, neg = pairs.positive[k][None], pairs.negative[k][None]
            rec = patching._Record()
            with tiny.hooks(rec):
                tiny.forward(pos)
            clean = rec.z[layer][:, :, head]
            base = tiny.forward(neg).logits[:, -1]
            with tiny.hooks(_ManualPatch(layer, head, clean)):
                patched = tiny.forward(neg).logits[:, -1]
            a, w = [pairs.answer[k]], [pairs.wrong[k]]
            effects.append(patching.logit_diff(patched, a, w) - patching.logit_diff(base, a, w))
        assert torch.allclose(res.effect[layer, head], torch.stack(effects).mean(), atol=1e-4)


def test_patching_bad_input(tiny):
    uneven = encode_pairs(
        tiny.tokenizer,
        [PromptPair("the red gate", "the gate", [" lamp"], [" river"])],
        require_aligned=False,
    )
    with pytest.raises(HeadhuntError, match="equal token length"):
        patching.activation_patching(tiny, uneven, progress=False)
    no_answers = encode_pairs(
        tiny.tokenizer, [PromptPair("the red", "the blue")], require_aligned=True
    )
    with pytest.raises(HeadhuntError, match="answer"):
        patching.attribution_patching(tiny, no_answers)
    ok = encode_pairs(
        tiny.tokenizer,
        [PromptPair("the red", "the blue", [" lamp"], [" river"])],
        require_aligned=True,
    )
    with pytest.raises(HeadhuntError, match="layers"):
        patching.activation_patching(tiny, ok, layers=[5], progress=False)


@pytest.mark.slow
def test_embedded_model_last_layers_patching_and_eap_agree(smol):
    # two IOI pairs, last three layers only: keeps the test short on a CPU
    pairs = make_pairs("ioi", smol.tokenizer, 2, seed=3)
    layers = [27, 28, 29]
    res = patching.activation_patching(smol, pairs, layers=layers, progress=False)
    assert res.shortcut  # running from layer l reproduces SmolLM2's full forward
    assert res.clean_metric > res.corrupt_metric  # the model does IOI
    assert torch.all(res.effect[:27] == 0)
    eap = patching.attribution_patching(smol, pairs)
    a, b = res.effect[layers].flatten(), eap[layers].flatten()
    # per-head effects of the last layers are nearly linear: EAP tracks patching
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.9
