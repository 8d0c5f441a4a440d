"""A score bias the model builds (Doge's dynamic mask, Inkling's position bias) runs the
kernels' torch path on every device: the Triton kernels take no bias, so on CUDA such a call
must leave them, never drop the bias. The CPU side is checked against eager attention by
``test_family_conforms``; here the same tiny model on a GPU must measure what it measures on
the CPU (statistics of a left-padded prefill, the decode argmax), up to float32 rounding.
Run on one H200 (torch 2.11, transformers 5.17): benchmarks/results/conformance_gpu/bias_h200.log."""

from __future__ import annotations

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.kernels.variant import AttentionVariant
from headhunt.probes.capture import capture_stats_and_counts, greedy_decode

from .conftest import build_pair, padded_batch, vocab

pytestmark = pytest.mark.gpu

FAMILIES = ["doge", "inkling_text", "inkling2_text"]


def _on(stats: dict, device: str) -> dict:
    return {layer: {f: getattr(s, f).to(device) for f in ("lse", "col_sum", "entropy", "argmax")}
            for layer, s in stats.items()}  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_a_biased_family_measures_on_the_gpu_what_it_measures_on_the_cpu(family):
    from transformers import CONFIG_MAPPING

    if family not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {family}")
    assert AttentionVariant(bias=torch.zeros(1, 1, 4, 4)).triton_unsupported() == ["bias"]
    try:
        hm = build_pair(family).hooked
    except HeadhuntError as err:  # transformers 5.17's Doge: refused as not causal, on the CPU
        pytest.skip(f"headhunt refuses this transformers' {family}: {err}")
    ids, mask = padded_batch(vocab(hm), seed=1)
    real = mask.bool()[:, None, :]
    cpu, cpu_counts = capture_stats_and_counts(hm, ids, attention_mask=mask, entropy=True)
    cpu_dec = greedy_decode(hm, ids, max_new_tokens=4, capture_argmax=True, attention_mask=mask)
    hm.model.to("cuda")
    gpu, gpu_counts = capture_stats_and_counts(
        hm, ids.cuda(), attention_mask=mask.cuda(), entropy=True
    )
    gpu_dec = greedy_decode(
        hm, ids.cuda(), max_new_tokens=4, capture_argmax=True, attention_mask=mask.cuda()
    )
    a, b = _on(cpu, "cpu"), _on(gpu, "cpu")
    assert a.keys() == b.keys() and len(a) > 0
    for layer in a:
        for field in ("lse", "entropy"):
            x, y = a[layer][field], b[layer][field]
            torch.testing.assert_close(torch.where(real, y, 0.0), torch.where(real, x, 0.0),
                                       atol=1e-4, rtol=1e-4, msg=f"layer {layer} {field}")  # fmt: skip
        torch.testing.assert_close(b[layer]["col_sum"], a[layer]["col_sum"], atol=1e-4, rtol=1e-4)
        # argmax may differ only where two keys tie to float32 rounding: none do here
        assert torch.equal(torch.where(real, b[layer]["argmax"], 0),
                           torch.where(real, a[layer]["argmax"], 0)), f"layer {layer}"  # fmt: skip
        assert torch.equal(gpu_counts[layer].cpu(), cpu_counts[layer])
    assert torch.equal(gpu_dec.tokens.cpu(), cpu_dec.tokens)
    assert torch.equal(gpu_dec.argmax.cpu(), cpu_dec.argmax)
