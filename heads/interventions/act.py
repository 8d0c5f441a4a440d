"""ACT: attention calibration of hidden sinks (Yu et al. 2024), as a reusable intervention.

For a chosen set of (layer, query head), :func:`act_calibration` replaces those heads' attention
output with one computed from *calibrated* attention probabilities:

- importance of key ``j`` as seen by query row ``p`` (absolute position): ``s_j(p) =
  sum_{i <= p} A[i, j] / (p - j + 1)``, the mean attention ``j`` received from the rows that
  see it, *up to and including row p*;
- the sinks of row ``p``: ``S_p = {j <= p : s_j(p) > tau and p - j + 1 >= min_queries}`` minus
  its lowest-index member (the "first sink", normally token 0), which is never calibrated;
- calibration of row ``p``: ``r = (1 - beta) * sum_{j in S_p} A[p, j]``, ``A[p, j] <- beta *
  A[p, j]`` on the sinks, and ``r`` is added to the other keys in proportion to their
  attention, so the row still sums to 1. A row whose whole mass is on sinks stays unchanged
  (the reference has no guard and divides by zero there).

**Causal sink sets (our choice, versus the reference).** The reference
(GATECH-EIC/ACT) computes one sink set per head from the whole prefill map, so a row's sinks
depend on rows *after* it; that cannot be reproduced in cached decoding, where later rows do
not exist yet, and their code breaks there. Here row ``p``'s sinks come from rows ``<= p``
only. A running per-head column sum over the keys is kept across calls, so a decode step's
``s_j`` is exactly what a prefill of the whole sequence gives at that row: prefill and cached
decoding are identical by construction (up to float rounding). For the *last* row of a prompt
(the one whose logits are scored in ACT's evaluation) the causal set equals the reference's
full-map set when ``min_queries = 1``; earlier rows see fewer rows than in the reference.

Only the selected heads' probabilities are computed, explicitly, in chunks of queries (the
largest intermediate is about ``batch * heads * chunk * keys`` floats); every other head keeps
the model's own SDPA output.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.scores import Head, check_heads


@dataclass
class ActConfig:
    """Settings of the calibration.

    Attributes:
        beta: factor applied to the attention on hidden sinks (ACT's 0.4); 1 leaves it alone.
        tau: a key is a sink of a row when its mean received attention ``s_j`` exceeds this.
        min_queries: a key must be seen by at least this many rows (itself included) before it
            can be a sink. 1 is the reference rule; larger values stop the most recent keys,
            seen by a handful of rows, from passing ``tau`` trivially.
        exclude_first: never calibrate each row's lowest-index sink (ACT keeps the first sink).
        chunk_elems: budget, in float32 elements, of one chunk of explicit probabilities.
    """

    beta: float = 0.4
    tau: float = 0.1
    min_queries: int = 1
    exclude_first: bool = True
    chunk_elems: int = 1 << 21

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta <= 1.0:
            raise HeadhuntError(f"beta must be in [0, 1], got {self.beta}")
        if not 0.0 <= self.tau < 1.0:
            raise HeadhuntError(f"tau must be in [0, 1), got {self.tau}")
        if self.min_queries < 1:
            raise HeadhuntError(f"min_queries must be at least 1, got {self.min_queries}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ActConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def calibrate_rows(
    probs: Float[Tensor, "*rows n"], sinks: Bool[Tensor, "*rows n"], beta: float
) -> Float[Tensor, "*rows n"]:
    """Apply ACT's calibration to attention rows.

    Args:
        probs: attention rows (each sums to 1 over the keys it sees).
        sinks: the keys to damp in each row (the first sink already removed).
        beta: the factor applied to the sink entries.

    Returns:
        Rows with the sink entries times ``beta`` and the removed mass given to the non-sink
        entries in proportion to their attention; rows with no non-sink mass are unchanged.
    """
    on_sinks = torch.where(sinks, probs, 0.0).sum(-1, keepdim=True)
    off_sinks = torch.where(sinks, 0.0, probs).sum(-1, keepdim=True)
    # A row with (almost) all its mass on sinks has nowhere to move the mass: leave it.
    movable = off_sinks > 1e-6
    grow = torch.where(movable, 1.0 + (1.0 - beta) * on_sinks / off_sinks.clamp_min(1e-30), 1.0)
    shrink = torch.where(movable, torch.full_like(on_sinks, beta), 1.0)
    return probs * torch.where(sinks, shrink, grow)


def causal_sink_mask(
    col_cum: Float[Tensor, "*lead rows n"],
    positions: Tensor,
    *,
    tau: float,
    min_queries: int,
    exclude_first: bool,
) -> Bool[Tensor, "*lead rows n"]:
    """Sink sets of rows from their running column sums.

    Args:
        col_cum: for each row ``p``, ``sum_{i <= p} A[i, j]`` for every key ``j``.
        positions: [rows] absolute position ``p`` of each row.
        tau, min_queries, exclude_first: see :class:`ActConfig`.

    Returns:
        True where key ``j`` is a (calibrated) sink of row ``p``.
    """
    n = col_cum.shape[-1]
    j = torch.arange(n, device=col_cum.device)
    count = positions[:, None] - j[None, :] + 1  # rows that have seen key j by row p
    s = col_cum / count.clamp_min(1).to(col_cum.dtype)
    mask = (s > tau) & (count >= min_queries) & (count >= 1)
    if exclude_first:
        first = mask.to(torch.uint8).argmax(-1, keepdim=True)  # lowest index of a True
        has = mask.any(-1, keepdim=True)
        drop = torch.zeros_like(mask).scatter_(-1, first, has)
        mask = mask & ~drop
    return mask


class ActHook(AttentionHook):
    """Replaces the selected heads' attention output by the calibrated one.

    Keeps, per layer, the running column sums of the selected heads' attention over the keys
    seen so far, so cached decoding continues exactly where prefill stopped. A call with no
    cache (``q_offset == 0``) starts a new sequence.
    """

    def __init__(self, heads: Iterable[Head], config: ActConfig | None = None):
        self.config = config or ActConfig()
        by_layer: dict[int, set[int]] = defaultdict(set)
        for layer, head in heads:
            by_layer[int(layer)].add(int(head))
        self.by_layer = {k: sorted(v) for k, v in by_layer.items()}
        self.state: dict[int, Tensor] = {}  # layer -> [b, heads, keys seen] column sums
        self.sink_mass: dict[int, Tensor] = {}  # layer -> [b, hq, nq] mass on sinks (last call)

    def layers(self) -> list[int]:
        return sorted(self.by_layer)

    def reset(self) -> None:
        self.state.clear()
        self.sink_mass.clear()

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        heads = self.by_layer.get(call.layer)
        if not heads:
            return output
        kw = call.kernel_kwargs()
        if not kw["causal"] or {"key_lo", "window", "chunk", "sinks", "row_sinks"} & set(kw):
            # Padding, windows and chunks break the per-key row counts s_j is normalised by;
            # with learned sinks the rows do not sum to 1.
            raise HeadhuntError(
                f"ACT calibration needs plain causal attention: layer {call.layer} has padding "
                "masks, a sliding window, chunks or learned sinks (right-pad, no mask)"
            )
        new, sink_mass, state = self._calibrated(call, heads)
        self.state[call.layer] = state
        self.sink_mass[call.layer] = sink_mass
        output = output.clone()
        output[:, :, heads] = new.transpose(1, 2).to(output.dtype)
        return output

    @torch.no_grad()
    def _calibrated(
        self, call: AttentionCall, heads: list[int]
    ) -> tuple[Float[Tensor, "b hq nq d"], Float[Tensor, "b hq nq"], Float[Tensor, "b hq nk"]]:
        cfg = self.config
        q, k, v = call.query, call.key, call.value
        b, hq, nq, _ = q.shape
        hkv, nk = k.shape[1], k.shape[2]
        off = nk - nq
        dev = q.device
        idx = torch.tensor(heads, device=dev)
        vh = v[:, idx // (hq // hkv)].float()  # only the selected heads' kv heads
        carry = torch.zeros(b, len(heads), nk, device=dev)
        if off > 0:
            prev = self.state.get(call.layer)
            if prev is None or prev.shape[0] != b or prev.shape[2] != off:
                raise HeadhuntError(
                    f"ACT state at layer {call.layer} does not match the KV cache "
                    f"({off} cached keys); run the prefill under the same calibration"
                )
            carry[..., :off] = prev
        out = torch.empty(b, len(heads), nq, vh.shape[-1], device=dev)
        sink_mass = torch.empty(b, len(heads), nq, device=dev)
        chunk = max(1, cfg.chunk_elems // max(1, b * len(heads) * nk))
        for i0 in range(0, nq, chunk):
            i1 = min(nq, i0 + chunk)
            kmax = off + i1  # keys visible to the chunk's last row
            pos = torch.arange(off + i0, off + i1, device=dev)
            # The model's own probabilities (scale, softcap); keys past kmax are all zero.
            probs = call.probs(slice(i0, i1), heads)[..., :kmax]
            cum = carry[..., None, :kmax] + probs.cumsum(-2)
            sinks = causal_sink_mask(
                cum,
                pos,
                tau=cfg.tau,
                min_queries=cfg.min_queries,
                exclude_first=cfg.exclude_first,
            )
            sink_mass[:, :, i0:i1] = torch.where(sinks, probs, 0.0).sum(-1)
            out[:, :, i0:i1] = calibrate_rows(probs, sinks, cfg.beta) @ vh[:, :, :kmax]
            carry[..., :kmax] = cum[..., -1, :]
        return out, sink_mass, carry


@contextlib.contextmanager
def act_calibration(
    model: HookedModel,
    heads: Iterable[Head],
    config: ActConfig | None = None,
) -> Iterator[ActHook]:
    """Calibrate the hidden sinks of ``heads`` ((layer, query head) pairs) inside the block.

    Works in prefill and in cached decoding (identical results, see the module docstring),
    with GQA, for any batch without left padding. Sinks are recomputed for every input.

    Example:
        >>> with act_calibration(model, [(5, 2), (12, 7)], ActConfig(beta=0.4)):
        ...     logits = model.forward(ids).logits
    """
    heads = check_heads(heads, model.n_layers, model.n_heads)
    hook = ActHook(heads, config)
    if not hook.by_layer:
        yield hook
        return
    with model.hooks(hook, layers=sorted(hook.by_layer)):
        yield hook
