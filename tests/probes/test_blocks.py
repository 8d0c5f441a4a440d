"""HookedModel.blocks: the decoder layers, found from the attention modules they own."""

from __future__ import annotations

import pytest
import torch

from headhunt.errors import HeadhuntError


def test_blocks_are_the_decoder_layers_in_order(tiny):
    blocks = tiny.blocks
    assert blocks is tiny.model.model.layers
    for layer, (block, attn) in enumerate(zip(blocks, tiny.modules, strict=True)):
        assert block.self_attn is attn and attn.headhunt_layer == layer


def test_blocks_refuses_a_model_without_one_layer_list():
    from headhunt.probes.tiny import tiny_llama

    m = tiny_llama()
    m.model.model.extra = torch.nn.ModuleList(list(m.model.model.layers))  # a second candidate
    with pytest.raises(HeadhuntError, match="cannot find the decoder layers"):
        _ = m.blocks
