"""Capture of attention statistics inside the forward equals the dense eager pattern."""

from __future__ import annotations

import torch

from headhunt.probes.capture import capture_attention_stats


def test_stats_capture_matches_dense_pattern(tiny, plain_model):
    ids = torch.randint(5, 60, (1, 37), device=tiny.device)
    stats = capture_attention_stats(tiny, ids)
    with torch.no_grad():
        dense = plain_model(tiny).to(tiny.device)(ids, output_attentions=True).attentions
    for layer, pattern in enumerate(dense):
        s = stats[layer]
        torch.testing.assert_close(s.col_sum, pattern.sum(2), atol=1e-5, rtol=1e-4)
        visible = torch.arange(
            37, 0, -1, dtype=torch.float32, device=tiny.device
        )  # queries that see key j
        torch.testing.assert_close(s.col_mean, pattern.sum(2) / visible, atol=1e-5, rtol=1e-4)
        assert torch.equal(s.argmax, pattern.argmax(-1))
