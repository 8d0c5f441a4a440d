"""Per-layer attention shapes (Gemma 4: larger heads in its global layers, KV sharing): a head is
(layer, head) with its layer's own size, captured as the model computes it; what needs one size
for the whole model refuses in one line."""

from __future__ import annotations

import copy

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.probes.tiny import tiny_causal_lm

# two sliding layers of 16-wide heads, two global layers of 512-wide heads (the class default);
# layers 2 and 3 reuse the keys and values of layers 0 and 1
GEMMA4 = {
    "num_hidden_layers": 4,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "num_kv_shared_layers": 2,
    "vocab_size_per_layer_input": 64,
    "hidden_size_per_layer_input": 16,
}


class Shapes(AttentionHook):
    def __init__(self):
        self.seen = {}

    def before(self, call) -> None:
        self.seen[call.layer] = (tuple(call.query.shape), tuple(call.key.shape))


@pytest.fixture(scope="module")
def gemma4():
    model = tiny_causal_lm("gemma4_text", **GEMMA4)
    plain = copy.deepcopy(model)
    return HookedModel(model=model, tokenizer=None, name="gemma4_text"), plain


def test_each_layer_has_its_own_head_size(gemma4):
    hm, _ = gemma4
    assert hm.head_dims == [16, 512, 16, 512] and hm.n_heads == 4 and hm.n_kv_heads == 2
    facts = hm.describe()
    assert facts["head_dim"] is None and facts["head_dims"] == [16, 512, 16, 512]
    with pytest.raises(HeadhuntError, match="head sizes vary per layer") as err:
        _ = hm.head_dim
    assert "\n" not in str(err.value)


def test_kv_shared_layers_are_captured_at_every_query(gemma4):
    """Gemma 4 runs its KV-shared layers on the kept logits' positions only; headhunt's
    captures ask for one logit and still see every query of those layers, with the keys the
    model computed in the layer they share, and the logit is the model's own."""
    hm, plain = gemma4
    ids = torch.randint(3, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    rec = Shapes()
    with hm.hooks(rec):
        got = hm.forward(ids, use_cache=False, logits_to_keep=1).logits
    assert rec.seen == {
        0: ((1, 4, 12, 16), (1, 2, 12, 16)),
        1: ((1, 4, 12, 512), (1, 2, 12, 512)),
        2: ((1, 4, 12, 16), (1, 2, 12, 16)),
        3: ((1, 4, 12, 512), (1, 2, 12, 512)),
    }
    want = plain(input_ids=ids, use_cache=False, logits_to_keep=1).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_key_heads_varying_per_layer_are_captured_per_layer():
    """Gemma 4 with ``attention_k_eq_v``: each layer keeps its own key-head count (captured
    exactly: tests/conformance); one count for the whole model is refused in one line."""
    model = tiny_causal_lm(
        "gemma4_text", attention_k_eq_v=True, num_global_key_value_heads=1, **GEMMA4
    )
    hm = HookedModel(model=model, tokenizer=None, name="gemma4_text")
    assert hm.kv_head_counts == [2, 1, 2, 1] and hm.score_kv_heads() == [2, 1, 2, 1]
    assert hm.describe()["n_kv_heads"] is None
    with pytest.raises(HeadhuntError, match="number of key heads varies per layer") as err:
        _ = hm.n_kv_heads
    assert "\n" not in str(err.value)
