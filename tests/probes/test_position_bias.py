"""A score bias the model builds and passes to its kernel (``position_bias``: Inkling's
hidden-state-conditioned relative-position bias) is measured exactly: planted calls whose bias
moves the argmax key, the rows and statistics following it; the decode argmax takes such a
layer off the many-layer kernel (which adds no bias); a bias of the wrong shape is refused in
one line. The families themselves are checked by tests/conformance."""

from __future__ import annotations

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.kernels import attention_stats
from headhunt.probes import capture
from headhunt.probes.attention import AttentionCall, check_call


def _planted(b: int = 2, hq: int = 2, n: int = 9):
    """q . k favours key 0 in every row; the bias puts +6 on key ``target[r, i]`` (the query
    itself in batch row 0, key i // 2 in batch row 1), head 1 only."""
    q = torch.ones(b, hq, n, 4)
    k = torch.zeros(b, 1, n, 4)
    k[:, :, 0] = 1.0  # score 2 on key 0 at scale 0.5
    i = torch.arange(n)
    target = torch.stack([i, i // 2])[:b]
    bias = torch.zeros(b, hq, n, n)
    for r in range(b):
        bias[r, 1, i, target[r]] = 6.0
    return q, k, bias, target


def test_a_planted_bias_moves_every_measured_row():
    q, k, bias, target = _planted()
    call = AttentionCall(0, q, k, k, None, 0.5, kwargs={"position_bias": bias})
    check_call(call)
    probs = call.probs()
    assert torch.equal(probs[:, 1].argmax(-1), target)  # head 1 follows the bias
    assert torch.equal(probs[:, 0].argmax(-1), torch.zeros_like(target))  # head 0 does not
    st = attention_stats(q, k, **call.kernel_kwargs())
    assert torch.equal(st.argmax[:, 1], target)
    torch.testing.assert_close(torch.exp(st.max_score - st.lse), probs.amax(-1))
    one = attention_stats(q[1:], k[1:], **call.kernel_kwargs(batch=1))  # batch row 1 alone
    assert torch.equal(one.argmax[0, 1], target[1])
    assert torch.equal(call.probs(heads=[1]), probs[:, 1:])


def test_a_biased_decode_step_stays_off_the_many_layer_kernel(monkeypatch):
    monkeypatch.setattr(capture.DecodeArgmax, "_batched_ok", lambda self, call: True)
    q, k, bias, target = _planted(b=1)
    call = AttentionCall(
        0, q[:, :, -1:], k, k, None, 0.5, kwargs={"position_bias": bias[:, :, -1:]}
    )
    hook = capture.DecodeArgmax(1)
    hook.before(call)
    assert not hook._pending
    assert hook.step[0].tolist() == [[0, int(target[0, -1])]]


def test_a_bias_of_the_wrong_shape_is_refused_in_one_line():
    q, k, bias, _ = _planted()
    call = AttentionCall(3, q, k, k, None, 0.5, kwargs={"position_bias": bias[..., :-1]})
    with pytest.raises(HeadhuntError) as err:
        check_call(call)
    assert "\n" not in str(err.value) and "layer 3: a position bias of shape" in str(err.value)


def test_sink_logits_per_query_row_take_their_share_of_each_row():
    """Inkling 2 passes ``sinks`` [b, hq, nq, 1]: one more logit in each row's softmax. On
    zero scores row i (i + 1 keys) keeps (i + 1) / (i + 1 + e^r) for its keys, in the dense
    rows and the kernels alike."""
    n = 7
    r = torch.linspace(-1.0, 2.0, n)
    q, k = torch.zeros(1, 2, n, 4), torch.randn(1, 1, n, 4)
    sinks = r.view(1, 1, n, 1).expand(1, 2, n, 1)
    call = AttentionCall(0, q, k, k, None, 0.5, kwargs={"sinks": sinks})
    check_call(call)
    i = torch.arange(n, dtype=torch.float64)
    kept = (i + 1) / (i + 1 + torch.exp(r.double()))
    torch.testing.assert_close(call.probs()[0, 1].sum(-1).double(), kept)
    st = attention_stats(q, k, **call.kernel_kwargs())
    torch.testing.assert_close(st.lse[0, 0].double(), torch.log(i + 1 + torch.exp(r.double())))
    bad = AttentionCall(2, q, k, k, None, 0.5, kwargs={"sinks": torch.zeros(2)})
    with pytest.raises(HeadhuntError) as err:
        check_call(bad)
    assert "\n" not in str(err.value) and "one sink logit per query row" in str(err.value)
