"""A hook may compute a layer's attention output in place of the model's kernel
(``AttentionHook.compute``); StatsCapture uses it for the fused output + statistics kernel."""

from __future__ import annotations

import pytest
import torch

import headhunt.kernels
import headhunt.probes.attention as attention
from headhunt.probes.attention import AttentionHook
from headhunt.probes.capture import capture_stats_and_counts

STATS = ("lse", "max_score", "argmax", "entropy", "col_sum", "col_mean")


def _eager_output(call):
    """The layer's attention output from its dense probabilities, [b, nq, hq, d]."""
    group = call.query.shape[1] // call.key.shape[1]
    v = call.value.float().repeat_interleave(group, dim=1)
    return (call.probs() @ v).to(call.value.dtype).transpose(1, 2).contiguous()


class Computes(AttentionHook):
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def compute(self, call):
        self.calls += 1
        return self.fn(call)


def test_computing_hook_replaces_the_kernel(tiny, monkeypatch):
    ids = torch.randint(5, 60, (2, 19), device=tiny.device)
    with torch.no_grad():
        plain = tiny.model(ids).logits
    seen = []

    class After(AttentionHook):
        def after(self, call, output):
            seen.append(output)
            return output

    def no_kernel(*args, **kwargs):
        raise AssertionError("the base kernel ran although a hook computed the output")

    monkeypatch.setattr(attention, "base_kernel", no_kernel)
    hook = Computes(_eager_output)
    with tiny.hooks(hook, After()), torch.no_grad():
        ours = tiny.model(ids).logits
    assert hook.calls == tiny.n_layers and len(seen) == tiny.n_layers
    torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-4)


def test_first_computing_hook_wins_and_declining_hooks_change_nothing(tiny):
    ids = torch.randint(5, 60, (1, 15), device=tiny.device)
    with torch.no_grad():
        plain = tiny.model(ids).logits
    decline = Computes(lambda call: None)
    with tiny.hooks(decline), torch.no_grad():
        assert torch.equal(tiny.model(ids).logits, plain)
    assert decline.calls == tiny.n_layers
    zeros = Computes(lambda call: torch.zeros_like(call.query.transpose(1, 2)))
    ones = Computes(lambda call: torch.ones_like(call.query.transpose(1, 2)))
    with tiny.hooks(decline, zeros, ones), torch.no_grad():
        zeroed = tiny.model(ids).logits
    assert zeros.calls == tiny.n_layers and ones.calls == 0
    assert not torch.allclose(zeroed, plain)


def _capture(tiny, ids, mask, **kw):
    return capture_stats_and_counts(tiny, ids, attention_mask=mask, entropy=True, **kw)


def _padded_batch(device):
    ids = torch.randint(5, 60, (2, 23), device=device)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    return ids, mask


def test_stats_capture_on_cpu_is_the_old_path(tiny):
    """Without CUDA the fused kernel declines: same statistics as fused=False, bit for bit."""
    if tiny.device.type != "cpu":
        pytest.skip("the CPU path")
    ids, mask = _padded_batch(tiny.device)
    fused, counts = _capture(tiny, ids, mask)
    old, old_counts = _capture(tiny, ids, mask, fused=False)
    for layer in old:
        assert torch.equal(counts[layer], old_counts[layer])
        for name in STATS:
            assert torch.equal(getattr(fused[layer], name), getattr(old[layer], name)), name


@pytest.mark.parametrize("computed_first", [False, True])
def test_stats_capture_computes_the_output_when_fusable(tiny, monkeypatch, computed_first):
    """The fused path through the hook, forced on the CPU (where attention_forward runs its
    torch backend in place of the Triton kernel): the statistics are the old path's and the
    model's output that of its own kernel, padding included. When another hook computes the output
    first, the statistics still come (the old way, in ``after``)."""
    from headhunt.probes.capture import StatsCapture

    ids, mask = _padded_batch(tiny.device)
    with torch.no_grad():
        plain = tiny.model(ids, attention_mask=mask).logits
    old, _ = _capture(tiny, ids, mask, fused=False)
    calls = []
    real = headhunt.kernels.attention_forward
    monkeypatch.setattr(
        headhunt.kernels, "attention_forward", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    monkeypatch.setattr(StatsCapture, "_fusable", lambda self, call: call.kernel_kwargs())
    cap = StatsCapture(entropy=True)
    first = (Computes(_eager_output),) if computed_first else ()
    with tiny.hooks(*first, cap), torch.no_grad():
        logits = tiny.model(ids, attention_mask=mask).logits
    assert len(calls) == (0 if computed_first else tiny.n_layers)
    assert cap.fused_layers == (set() if computed_first else set(range(tiny.n_layers)))
    for name in STATS:  # layer 0 sees the same q, k; later layers the computed outputs
        assert torch.equal(getattr(cap.stats[0], name), getattr(old[0], name)), name
        for layer in old:
            got, want = getattr(cap.stats[layer], name), getattr(old[layer], name)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits[0], plain[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits[1, 6:], plain[1, 6:], atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "family,overrides",
    [
        ("llama", {}),
        ("mistral", {"sliding_window": 8}),
        ("gemma2", {"sliding_window": 8}),  # softcaps, sliding + full layers
        ("gpt_oss", {"sliding_window": 8}),  # learned sinks
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_capture_on_cuda_matches_the_model(family, overrides, dtype):
    """On CUDA the fused kernel serves the whole-sequence calls: the model's logits stay
    those of its own kernel (in bf16: no further from the float32 model's than its own
    kernel's, which for eager layers rounds the scores to bf16) and the statistics those of
    the two-pass path."""
    from headhunt.kernels import triton_available
    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm

    if not triton_available():
        pytest.skip("no Triton")
    model = tiny_causal_lm(family, **overrides).to("cuda")
    hm = HookedModel(model=model, tokenizer=None, name=family)
    ids = torch.randint(5, 60, (2, 40), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    with torch.no_grad():
        exact = model(ids, attention_mask=mask).logits.float()
        model.to(dtype)
        plain = model(ids, attention_mask=mask).logits.float()
    old, _ = _capture(hm, ids, mask, fused=False)
    from headhunt.probes.capture import StatsCapture

    cap = StatsCapture(entropy=True)
    fused = []
    real = headhunt.kernels.attention_forward
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            headhunt.kernels, "attention_forward", lambda *a, **k: fused.append(1) or real(*a, **k)
        )
        with hm.hooks(cap), torch.no_grad():
            logits = model(ids, attention_mask=mask).logits.float()
    assert len(fused) == hm.n_layers  # every layer through the fused kernel
    assert cap.fused_layers == set(range(hm.n_layers))
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    scale = max(1.0, plain.abs().max().item())
    real_rows = [(0, slice(None)), (1, slice(7, None))]  # pad rows' outputs are free
    for row, cols in real_rows:
        err = (logits[row, cols] - plain[row, cols]).abs().max().item()
        if dtype == torch.float32:
            assert err < tol * scale
        else:
            own = (plain[row, cols] - exact[row, cols]).abs().max().item()
            ours = (logits[row, cols] - exact[row, cols]).abs().max().item()
            assert ours <= 2 * own + 0.02 * scale, (ours, own)
    for layer, ref in old.items():
        got = cap.stats[layer]
        seen = torch.isfinite(ref.max_score)
        for name in ("lse", "max_score", "entropy"):
            a, b = getattr(got, name)[seen], getattr(ref, name)[seen]
            assert (a - b).abs().max().item() < 10 * tol * max(1.0, b.abs().max().item()), name
        torch.testing.assert_close(got.col_sum, ref.col_sum, atol=10 * tol, rtol=10 * tol)


@pytest.mark.gpu
def test_offloaded_stats_equal_device_stats(tiny):
    if tiny.device.type != "cuda":
        pytest.skip("run with --device cuda")
    ids, mask = _padded_batch(tiny.device)
    dev, _ = _capture(tiny, ids, mask)
    host, _ = _capture(tiny, ids, mask, offload=True)
    for layer in dev:
        for name in STATS:
            got = getattr(host[layer], name)
            assert got.device.type == "cpu" and got.is_pinned()
            assert torch.equal(got, getattr(dev[layer], name).cpu()), name
