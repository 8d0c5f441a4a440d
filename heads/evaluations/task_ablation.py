"""The causal check of task heads: ablate a detector's top-k heads and measure task accuracy.

The ablations of a head's output (before the output projection): ``zero`` (the output is 0
at every position: :class:`headhunt.heads.interventions.masking.HeadMask` in "output" mode),
``mean`` (at every position the output is replaced by its mean over every position of a
reference set of the same task, as LOCOS does) and ``mean-keep-first`` (the same at every
position but the first, whose output is kept; the mean is over the reference set's positions
but the first). The first token is the attention sink (Xiao et al. 2023, arXiv 2309.17453):
most heads put most of their mass on it, and its residual is unlike every other position's
(Sun et al. 2024, arXiv 2402.17762, massive activations), so a mean taken over the task's
positions is far from what a head writes there; ``mean-keep-first`` measures how much of a
mean ablation's damage comes from that one position. Accuracy is greedy exact match of the gold answer, read from one
teacher-forced pass (the answer is reproduced by greedy decoding exactly when every answer
token is its row's argmax). Each top-k set is compared with random sets of k heads and with
closed-book prompts the full model answers without any context (the specificity control).

``mean-readout`` (and ``zero-readout``) restrict the ablation to the rows that read the context:
from the question's first token through the answer. The context rows keep the head's own
output, so what the documents' encoding needs from a head stays, and only the head's part in
reading the documents and producing the answer is removed; the mean put in is the head's mean
over the reference set's question and answer rows. Restricting an ablation to chosen token
positions is how circuit analyses isolate a head's role where it acts (Wang et al. 2022,
"Interpretability in the Wild", arXiv 2211.00593: the IOI circuit's heads are mean-ablated at
the positions of the circuit, path patching at the END token). A closed-book prompt has no
context: its question is the prompt itself, so there every row but the first (BOS) is ablated.
The registry of ablations: :data:`headhunt.heads.evaluations.task_modes.MODES`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from headhunt.heads.evaluations.task_modes import MODES
from headhunt.heads.interventions.masking import HeadMask
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel


class MeanAblation(AttentionHook):
    """Replaces chosen heads' outputs by fixed means ([hq, d] per layer; ``means=None``: 0),
    at every position from ``start`` on (1: the first position's output is kept), or with
    ``readout`` only at each sequence's rows from its readout start on (:meth:`for_batch`
    gives them, one per sequence of the batch; the rows before keep their own output)."""

    def __init__(
        self,
        heads: Iterable[tuple[int, int]],
        means: dict[int, Tensor] | None,
        start: int = 0,
        readout: bool = False,
    ):
        self.by_layer: dict[int, list[int]] = defaultdict(list)
        for layer, head in heads:
            self.by_layer[int(layer)].append(int(head))
        self.means = means
        self.start = start
        self.readout = readout
        self.starts: Tensor | None = None

    def for_batch(self, starts: Sequence[int]) -> None:
        """Each sequence's first ablated row (absolute position), for a readout ablation."""
        self.starts = torch.as_tensor(list(starts), dtype=torch.long)

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        heads = self.by_layer.get(call.layer)
        if not heads:
            return output
        output = output.clone()
        if self.means is None:
            mean = output.new_zeros(len(heads), output.shape[-1])
        else:
            mean = self.means[call.layer][heads].to(output.device, output.dtype)
        if not self.readout:
            output[:, self.start :, heads] = mean[None, None]
            return output
        if self.starts is None or len(self.starts) != output.shape[0]:
            raise ValueError("a readout ablation needs each sequence's readout start (for_batch)")
        # absolute position of each row (a pass on a cache starts past its prefix)
        pos = torch.arange(output.shape[1], device=output.device) + call.query_position
        rows = pos[None, :] >= self.starts.to(output.device)[:, None]  # [b, t]
        output[:, :, heads] = torch.where(rows[:, :, None, None], mean[None, None],
                                          output[:, :, heads])  # fmt: skip
        return output


def mean_outputs(
    total, first, count: int, sequences: int, readout=None, readout_count: int = 0
) -> dict[str, dict[int, Tensor]]:
    """The per-layer means ([hq, d]) a mean ablation puts in, from sums over a reference set
    (``total``/``first``/``readout``: [layer, hq, d] arrays summed over every position / the
    first ones / the readout rows, ``count`` positions in ``sequences`` sequences,
    ``readout_count`` readout rows): ``mean`` over every position, ``mean-keep-first`` over
    every position but the first of each sequence, ``mean-readout`` (when ``readout`` is
    given) over the readout rows (each sequence's question and answer rows)."""
    import numpy as np

    total, first = np.asarray(total), np.asarray(first)
    rest = (total - first) / (count - sequences)
    means = [("mean", total / count), ("mean-keep-first", rest)]
    if readout is not None:
        means.append(("mean-readout", np.asarray(readout) / readout_count))
    return {
        mode: {la: torch.tensor(m[la], dtype=torch.float32) for la in range(len(m))}
        for mode, m in means
    }


@torch.inference_mode()
def reference_means(
    model: HookedModel,
    sequences: Sequence[Sequence[int]],
    readout_starts: Sequence[int] | None = None,
    batch_size: int = 64,
) -> dict[str, dict[int, Tensor]]:
    """:func:`mean_outputs` over a reference set of token sequences; with ``readout_starts``
    (each sequence's first readout row) also ``mean-readout``. Sequences of the same length
    and readout start go through one forward (no padding: the sums are those of one forward
    each), ``batch_size`` at a time."""
    import numpy as np

    from headhunt.heads.taskheads import OutputSum

    groups: dict[tuple[int, int | None], list[list[int]]] = defaultdict(list)
    for i, ids in enumerate(sequences):
        start = None if readout_starts is None else int(readout_starts[i])
        groups[(len(ids), start)].append(list(ids))
    sums = OutputSum()
    with model.hooks(sums):
        for (_, start), group in groups.items():
            sums.readout_from = start
            for b in range(0, len(group), batch_size):
                model.forward(torch.tensor(group[b : b + batch_size], device=model.device),
                              use_cache=False, logits_to_keep=1)  # fmt: skip
    layers = range(model.n_layers)
    total = np.stack([sums.total[la].numpy() for la in layers])
    first = np.stack([sums.first[la].numpy() for la in layers])
    readout = None
    if readout_starts is not None:
        readout = np.stack([sums.readout[la].numpy() for la in layers])
    return mean_outputs(total, first, sums.count, len(sequences), readout, sums.readout_count)


def closed_book_control(
    model: HookedModel, batch_size: int
) -> tuple[list[tuple[list[int], int]], list[int], dict[str, dict[int, Tensor]]]:
    """The specificity control's inputs: the closed-book prompts the full model answers, as
    (ids, answer start), each one's first readout row, and the means a mean ablation puts in
    there (over the closed-book reference prompts, never evaluated)."""
    from headhunt.heads.inputs.task_inputs import CLOSED_BOOK_REFERENCE, closed_book_ids

    tok = model.tokenizer
    # a closed-book prompt is all question: its readout rows are every row but the BOS
    row = int(tok.bos_token_id is not None)
    book = [(p + a, len(p)) for p, a in closed_book_ids(tok)]
    right = answers_right(model, book, batch_size=batch_size)
    kept = [b for b, ok in zip(book, right, strict=True) if ok]
    ref = [p + a for p, a in closed_book_ids(tok, CLOSED_BOOK_REFERENCE)]
    means = reference_means(model, ref, [row] * len(ref))
    return kept, [row] * len(kept), means


def ablation(heads: Sequence[tuple[int, int]], mode: str, means: dict[str, dict[int, Tensor]]):
    """The hook of one ablation (none for no heads); ``means[mode]``: the per-layer means."""
    if not heads:
        return []
    m = MODES[mode]
    if m.rows == "all" and not m.mean:
        return [HeadMask(heads, "output")]
    return [MeanAblation(heads, means[mode] if m.mean else None,
                         start=1 if m.rows == "after-first" else 0,
                         readout=m.rows == "readout")]  # fmt: skip


@torch.inference_mode()
def answers_right(
    model: HookedModel,
    sequences: Sequence[tuple[list[int], int]],
    hooks: Sequence[AttentionHook] = (),
    batch_size: int = 1,
    readout: Sequence[int] | None = None,
) -> list[bool]:
    """For each (ids, answer start): whether greedy decoding reproduces ids[answer start:].

    Sequences go ``batch_size`` at a time, padded on the right: under causal attention a
    token never sees the padding after it, so each sequence's rows are its own (no attention
    mask needed, positions unchanged). Only the answer rows go through the output embedding.
    ``readout``: each sequence's first readout row (the question's first token), which a
    readout ablation needs.
    """
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    out: dict[int, bool] = {}
    decoder = model.model.get_decoder()
    unembed = model.model.get_output_embeddings()
    per_row = [h for h in hooks if getattr(h, "readout", False)]
    if per_row and readout is None:
        raise ValueError("a readout ablation needs each sequence's readout start")
    with model.hooks(*hooks):
        for b in range(0, len(order), batch_size):
            batch = [sequences[i] for i in order[b : b + batch_size]]
            for h in per_row:
                h.for_batch([readout[i] for i in order[b : b + batch_size]])
            width = max(len(ids) for ids, _ in batch)
            ids = torch.tensor([s + [s[-1]] * (width - len(s)) for s, _ in batch],
                               device=model.device)  # fmt: skip
            hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
            for row, (i, (seq, a0)) in enumerate(zip(order[b : b + batch_size], batch,
                                                     strict=True)):  # fmt: skip
                # Row t predicts token t + 1; the argmax is the same before a logit softcap.
                logits = unembed(hidden[row, a0 - 1 : len(seq) - 1])
                gold = torch.tensor(seq[a0:], device=logits.device)
                out[i] = bool((logits.argmax(-1) == gold).all())
    return [out[i] for i in range(len(sequences))]
