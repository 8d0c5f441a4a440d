"""The doors to the ecosystem: an nnsight model and a TransformerLens bridge over a HookedModel's
weights give the attention patterns and head outputs of headhunt's own captures, and leave
headhunt's hooks working."""

from __future__ import annotations

import pytest
import torch

from headhunt.heads.interventions.masking import mask_heads
from headhunt.kernels import attention_probs_at
from headhunt.probes.attention import AttentionHook
from headhunt.probes.capture import capture_attention_stats, capture_qk
from headhunt.probes.hooked import HookedModel, _twin

pytest.importorskip("nnsight")


class HeadOutputs(AttentionHook):
    """headhunt's view of a layer's head outputs: [b, nq, hq, d], before o_proj."""

    def __init__(self) -> None:
        self.out: dict[int, torch.Tensor] = {}

    def after(self, call, output):
        self.out[call.layer] = output.detach().clone()
        return output


def headhunt_pattern(model: HookedModel, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """[hq, n, n] attention probabilities from headhunt's captures: the kernels' exact
    probabilities at every (query, key) pair from the captured q, k and log-sum-exp."""
    q, k = capture_qk(model, ids, layers=[layer])[layer]
    stats = capture_attention_stats(model, ids, layers=[layer])[layer]
    n = ids.shape[-1]
    qi, ki = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    scale = model.modules[layer].scaling
    probs = attention_probs_at(q, k, stats.lse, qi.flatten(), ki.flatten(), scale=scale)
    return probs.reshape(model.n_heads, n, n)


def headhunt_head_outputs(model: HookedModel, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """[n, hq, d] head outputs as headhunt's attention hooks see them."""
    hook = HeadOutputs()
    with model.hooks(hook, layers=[layer]):
        model.forward(ids)
    return hook.out[layer][0]


def dense_pattern(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal softmax(q k^T * scale) for one sequence, KV heads repeated: [hq, n, n]."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q[0] @ k[0].transpose(-1, -2)).double() * scale
    n = q.shape[2]
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1).float()


def test_nnsight_traces_the_model_with_headhunt_hooks_in_force():
    from headhunt.probes.tiny import tiny_llama

    model = tiny_llama()  # its own model: nnsight instruments the modules it wraps
    ids = model.encode("the secret code is blue and the vault is red")[None]
    lm = model.nnsight()
    with lm.trace(ids):
        z = lm.model.layers[1].self_attn.o_proj.input.save()
        logits = lm.output.logits.save()
    torch.testing.assert_close(
        z.reshape(-1, model.n_heads, model.head_dim), headhunt_head_outputs(model, ids, 1)
    )
    torch.testing.assert_close(logits, model.forward(ids).logits)

    # A headhunt intervention around a trace acts inside it ...
    with mask_heads(model, [(1, 2)], mode="output"):
        masked = model.forward(ids).logits
        with lm.trace(ids):
            z = lm.model.layers[1].self_attn.o_proj.input.save()
            traced = lm.output.logits.save()
    d = model.head_dim
    assert z[..., 2 * d : 3 * d].abs().max() == 0
    torch.testing.assert_close(traced, masked)
    assert (masked - logits).abs().max() > 1e-3
    # ... and the same edit written in nnsight gives the same model.
    with lm.trace(ids):
        lm.model.layers[1].self_attn.o_proj.input[..., 2 * d : 3 * d] = 0
        edited = lm.output.logits.save()
    torch.testing.assert_close(edited, masked)


@pytest.fixture(scope="module")
def door_model(smol) -> HookedModel:
    """The embedded model on its own module tree sharing smol's weights, so nnsight's
    instrumentation of the modules stays out of the rest of the session."""
    return HookedModel(model=_twin(smol.model), tokenizer=smol.tokenizer, name=smol.name)


TEXT = "When Mary and John went to the store, John gave a drink to"
LAYER = 5


@pytest.mark.slow
def test_nnsight_door_gives_headhunts_patterns_and_head_outputs(door_model):
    model = door_model
    ids = model.encode(TEXT)[None]
    lm = model.nnsight()
    with lm.trace(ids):
        q, k = lm.model.layers[LAYER].self_attn.source.apply_rotary_pos_emb_0.output
        q, k = q.save(), k.save()
        z = lm.model.layers[LAYER].self_attn.o_proj.input.save()
    scale = model.modules[LAYER].scaling
    torch.testing.assert_close(
        dense_pattern(q, k, scale), headhunt_pattern(model, ids, LAYER), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        z[0].reshape(-1, model.n_heads, model.head_dim),
        headhunt_head_outputs(model, ids, LAYER),
        atol=1e-6,
        rtol=0,
    )


@pytest.mark.slow
def test_bridge_door_gives_headhunts_patterns_and_head_outputs(door_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = door_model
    ids = model.encode(TEXT)[None]
    base = model.forward(ids).logits
    bridge = model.bridge()
    logits, cache = bridge.run_with_cache(ids)
    # TransformerLens runs its own eager attention: equal up to float32 rounding.
    pattern = cache[f"blocks.{LAYER}.attn.hook_pattern"][0]
    torch.testing.assert_close(pattern, headhunt_pattern(model, ids, LAYER), atol=1e-4, rtol=0)
    z = cache[f"blocks.{LAYER}.attn.hook_z"][0]
    torch.testing.assert_close(z, headhunt_head_outputs(model, ids, LAYER), atol=1e-4, rtol=0)
    torch.testing.assert_close(logits, base, atol=1e-3, rtol=0)

    # The wrapped model keeps its attention and its hooks after the bridge booted.
    assert model.model.config._attn_implementation == "headhunt"
    with mask_heads(model, [(LAYER, 1), (LAYER, 2)]):
        masked = model.forward(ids).logits
    assert (masked - base).abs().max() > 1e-2
