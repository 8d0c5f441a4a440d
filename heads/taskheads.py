"""Heads for a user's task: three detectors per head from one teacher-forced pass per example.

For one example (:class:`headhunt.heads.inputs.task_inputs.Encoded`) the gold answer is fed after the
prompt, so every head is scored whether or not the model would have answered correctly; the
pass also says whether it would have (every answer token is the argmax of its row's logits,
i.e. greedy decoding reproduces the answer). A second pass over the null prompt (the question
replaced by "N/A") calibrates query focus, as QRHead does.

- **copy** (Wu et al. 2024, arXiv 2404.15574, under teacher forcing): at answer step t the head's
  argmax key lies in an evidence document and holds the gold token t; the score is the share
  of answer steps where that holds.
- **query focus** (QRHead, Zhang et al. 2025, arXiv 2506.09944): per context token, the
  attention from the question's rows (averaged over them) minus the same from the null
  question's rows; per document, QRHead's filter (``qr_document_scores``: tokens at or below
  the document's mean minus two standard deviations are dropped) and the sum of the rest.
  The head's score is that on the evidence documents, and its document ranking is scored by
  recall@1 and NDCG@10 against the evidence. The retriever filters the *sum* over its heads
  per token, as QRHead's retriever does.
- **write** (LOCOS, arXiv 2607.01002): at answer step t the head writes
  ``sum_j p_tj W_O^h v_j``; its component toward the gold token's logit, with the final
  RMSNorm linearised (its scale ``1 / rms(x_t)`` frozen at the real final residual ``x_t``,
  so the component is ``(W_O^h z) . (g * U[gold]) / rms(x_t)``, exact for the real
  residual: the logit is the sum of its components' values), summed over the evidence keys
  (L+) minus LOCOS's L-: the same summed over every other key the row sees (BOS, instruction,
  question and earlier answer tokens included), times the row's evidence keys over those
  other keys, so that both stand for a span of the evidence's length (aryopg/locos,
  ``locos/detectors/logit_contrib.py``; a head that spreads its write evenly scores 0).
  Averaged over answer steps, and over the examples the model answers correctly (LOCOS's
  correctness filter).

Probabilities are exact: each chosen row's log-sum-exp comes from
:func:`headhunt.kernels.attention_stats` on the question and answer rows only, and a row's
probabilities on the keys are ``exp(score - lse)`` (the same numbers as
:func:`headhunt.kernels.attention_probs_at`): a few dense rows, never an N x N matrix, with the
layer's own mask, window and softcap.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs.task_inputs import Encoded
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel

DETECTORS = {"copy": "copy_score", "query": "query_focus", "write": "write_score"}


def _rows_kwargs(kw: dict, start: int, stop: int) -> dict:
    """Kernel options of rows [start, stop) of a call (offset moved, per-row bounds sliced)."""
    kw = dict(kw)
    kw["q_offset"] = kw.get("q_offset", 0) + start
    for name in ("key_lo", "key_hi"):
        if name in kw:
            kw[name] = kw[name][:, start:stop]
    for name in ("bias", "row_sinks"):  # what the model builds per query row: these rows'
        if name in kw:
            kw[name] = kw[name][:, :, start:stop]
    return kw


class TaskCapture(AttentionHook):
    """Per layer, from one forward of a batch-1 sequence: each head's mean attention mass per
    document from ``rows`` (question rows), and at ``answer_rows`` its argmax key and its
    attention-weighted values over the evidence keys and over every other key the row sees.

    Attributes (per layer, float32 on the CPU):
        tokens: [hq, context keys] mean over ``rows`` of the probability on each context key
            (from the first document's first token to the last one's end), on the device.
        mass: [hq, docs] the same summed over each document's keys.
        argmax: [hq, answer] absolute argmax key of each answer row.
        z_evidence, z_off: [answer, hq, d] sum_j p_j v_j over the evidence keys / over every
            other key (BOS, instruction, question, earlier answer tokens included).
        off_scale: [answer] the row's visible evidence keys over its visible other keys
            (LOCOS's rescaling of the off-evidence sum to a span of the evidence's length).
    """

    def __init__(
        self,
        doc_spans: Sequence[tuple[int, int]],
        evidence: Sequence[int],
        rows: tuple[int, int],
        answer_rows: tuple[int, int] | None = None,
    ):
        self.doc_spans = list(doc_spans)
        self.rows = rows
        self.answer_rows = answer_rows
        self.lo, self.hi = self.doc_spans[0][0], self.doc_spans[-1][1]
        n = self.hi - self.lo
        doc_of = torch.full((n,), len(self.doc_spans), dtype=torch.long)  # last slot: not a doc
        for i, (s, e) in enumerate(self.doc_spans):
            doc_of[s - self.lo : e - self.lo] = i
        self.doc_of = doc_of
        self.on_evidence = torch.zeros(n, dtype=torch.bool)
        for i in evidence:
            s, e = self.doc_spans[i]
            self.on_evidence[s - self.lo : e - self.lo] = True
        self.tokens: dict[int, Tensor] = {}
        self.mass: dict[int, Tensor] = {}
        self.argmax: dict[int, Tensor] = {}
        self.z_evidence: dict[int, Tensor] = {}
        self.z_off: dict[int, Tensor] = {}
        self.off_scale: dict[int, Tensor] = {}

    def before(self, call: AttentionCall) -> None:
        if call.query.shape[0] != 1 or call.key_start != 0:
            raise HeadhuntError("task heads are captured one whole sequence at a time")
        kw = call.kernel_kwargs()
        # rows are positions in the sequence; a pass over a cached prefix has its query rows
        # from q_offset on (every key from 0: key_start is 0)
        off = call.q_offset
        s, e = self.rows[0] - off, self.rows[1] - off
        if s < 0:
            raise HeadhuntError("task heads: the question's rows are in the cached prefix")
        self.tokens[call.layer], self.mass[call.layer] = self._mass(call, kw, s, e)
        if self.answer_rows is not None:
            self._answer(call, kw, self.answer_rows[0] - off, self.answer_rows[1] - off)

    def _lse(self, call: AttentionCall, kw: dict, s: int, e: int):
        from headhunt.kernels import attention_stats

        q = call.query[:, :, s:e]
        return attention_stats(q, call.key, key_stats=False, **_rows_kwargs(kw, s, e))

    def probs(
        self, call: AttentionCall, lse, s: int, e: int, keys: slice | None = None
    ) -> Float[Tensor, "hq rows keys"]:
        """Exact probabilities of rows [s, e) on ``keys`` (default: the context's):
        ``exp(score - lse)`` (0 where the row cannot see the key), the scores as the layer's
        kernel makes them (scale, softcap, mask and window: :meth:`AttentionCall.scores`, a
        few dense rows), the log-sum-exp from the kernels (so a learned sink's share is left
        out, as in the model). The same numbers as
        :func:`headhunt.kernels.attention_probs_at` on every (row, key) pair, in one matmul
        per layer instead of a gather per pair."""
        scores = call.scores(slice(s, e))[0, :, :, keys or slice(self.lo, self.hi)]
        return torch.exp(scores - lse[0][..., None])

    def _mass(self, call, kw, s, e) -> tuple[Tensor, Tensor]:
        stats = self._lse(call, kw, s, e)
        p = self.probs(call, stats.lse, s, e).mean(1)  # [hq, keys]
        mass = torch.zeros(p.shape[0], len(self.doc_spans) + 1, device=p.device)
        mass.index_add_(1, self.doc_of.to(p.device), p)
        return p, mass[:, :-1].cpu()  # tokens stay on the device: filtered there

    def _answer(self, call, kw, s, e) -> None:
        stats = self._lse(call, kw, s, e)
        hkv = call.key.shape[1]
        self.argmax[call.layer] = (stats.argmax[0] + call.key_start).cpu()  # [hq, answer]
        p = self.probs(call, stats.lse, s, e, keys=slice(None))  # [hq, rows, every key]
        hq, r, nk = p.shape
        ev = torch.zeros(nk, dtype=torch.bool, device=p.device)
        ev[self.lo : self.hi] = self.on_evidence.to(p.device)
        # GQA by grouping each KV head's query heads, never copying its values
        pg = p.view(hkv, hq // hkv, r, nk)
        vals = call.value[0].float()  # [hkv, keys, d]
        for name, keys in (("z_evidence", ev), ("z_off", ~ev)):
            z = torch.einsum("hgrk,hkd->rhgd", pg * keys, vals).reshape(r, hq, -1)
            getattr(self, name)[call.layer] = z.cpu()
        seen = call.visible(slice(s, e))[0].to(p.device)  # [rows, keys]: mask, window
        n_ev, n_off = (seen & ev).sum(-1), (seen & ~ev).sum(-1)
        self.off_scale[call.layer] = (n_ev / n_off.clamp(min=1)).float().cpu()


class OutputSum(AttentionHook):
    """Sum and count of every head's output (before o_proj) over all positions, and its value
    at the first position: the means a mean ablation puts in its place (over every position,
    or over every position but the first). With ``readout_from`` (an absolute position: the
    question's first token) also the sum and count over the rows from there on, the readout
    rows whose mean ``mean-readout`` puts in."""

    def __init__(self, readout_from: int | None = None):
        self.total: dict[int, Tensor] = {}
        self.first: dict[int, Tensor] = {}
        self.readout: dict[int, Tensor] = {}
        self.count = 0
        self.readout_count = 0
        self.readout_from = readout_from

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        # a batch (sequences of one length, no padding) adds its sequences one by one, each
        # as a pass of one sequence would
        for b in range(output.shape[0]):
            self._add(call, output[b].detach().float())
        return output

    def _add(self, call: AttentionCall, out: Tensor) -> None:
        self.total[call.layer] = self.total.get(call.layer, 0) + out.sum(0).cpu()  # [hq, d]
        first = out[0].cpu() if call.q_offset == 0 else torch.zeros_like(out[0].cpu())
        self.first[call.layer] = self.first.get(call.layer, 0) + first  # a cached pass: none
        if call.layer == 0:
            self.count += out.shape[0]
        if self.readout_from is not None:
            # rows at or past readout_from (a pass on a cache starts past its prefix)
            part = out[max(0, self.readout_from - call.query_position) :]
            self.readout[call.layer] = self.readout.get(call.layer, 0) + part.sum(0).cpu()
            if call.layer == 0:
                self.readout_count += part.shape[0]


# ---------------------------------------------------------------- the final norm, linearised


def final_norm(model: HookedModel) -> torch.nn.Module:
    """The decoder's final RMSNorm (refused, one line, when it is something else)."""
    inner = getattr(model.model, "model", None) or model.model
    get_decoder = getattr(model.model, "get_decoder", None)
    if callable(get_decoder):
        inner = get_decoder() or inner
    for name in ("norm", "final_layernorm", "ln_f", "final_norm"):
        norm = getattr(inner, name, None)
        if isinstance(norm, torch.nn.Module):
            if "RMSNorm" not in type(norm).__name__ or _eps(norm) is None:
                raise HeadhuntError(
                    f"the final norm is a {type(norm).__name__}; the write score linearises "
                    "an RMSNorm only"
                )
            return norm
    raise HeadhuntError("no final norm found (norm, final_layernorm, ln_f): no write score")


def _eps(norm: torch.nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(norm, name, None)
        if isinstance(value, float | int):
            return float(value)
    return None


def norm_gain(norm: torch.nn.Module, d_model: int) -> Float[Tensor, " d_model"]:
    """The RMSNorm's effective gain g (``norm(x) = g * x / rms(x)``; Gemma's ``1 + w`` too),
    read off the module: a ones vector has rms ``sqrt(1 + eps)``."""
    p = next(norm.parameters())
    with torch.no_grad():
        ones = torch.ones(1, d_model, device=p.device, dtype=p.dtype)
        return norm(ones)[0].float() * math.sqrt(1 + _eps(norm))


def rms(norm: torch.nn.Module, x: Float[Tensor, "*rows d_model"]) -> Float[Tensor, "*rows"]:
    """``sqrt(mean(x^2) + eps)``: the scale the linearisation freezes."""
    x = x.float()
    return torch.sqrt(x.pow(2).mean(-1) + _eps(norm))


class _FinalResidual:
    """Forward pre-hook of the final norm: keeps its input at chosen rows."""

    def __init__(self, norm: torch.nn.Module, rows: tuple[int, int], offset: int = 0):
        self.rows, self.x, self.offset = rows, None, offset  # offset: tokens in a cache
        self.handle = norm.register_forward_pre_hook(self)

    def __call__(self, module, args):
        s, e = self.rows[0] - self.offset, self.rows[1] - self.offset
        self.x = args[0][0, s:e].detach().float()


# ---------------------------------------------------------------- one example


def qr_document_scores(
    calibrated: Float[Tensor, "*heads keys"], spans: Sequence[tuple[int, int]]
) -> Float[Tensor, "*heads docs"]:
    """QRHead's document score from calibrated token scores (``calibrated``: the question's
    attention to each context key minus the null question's; ``spans``: each document's
    [start, end) in those keys). Within a document, the tokens whose score is at or below the
    document's mean minus two standard deviations (unbiased, torch's default) are dropped and
    the rest summed (princeton-pli/QRHead, ``src/qrretriever/attn_retriever.py``: an outlier
    filter against tokens the null question attends to far more than the question). A
    one-token document has no spread: its token is kept."""
    out = []
    for s, e in spans:
        part = calibrated[..., s:e]
        if e - s < 2:
            out.append(part.sum(-1))
            continue
        floor = part.mean(-1, keepdim=True) - 2 * part.std(-1, keepdim=True)
        out.append(torch.where(part > floor, part, 0).sum(-1))
    return torch.stack(out, -1)


@dataclass
class ExampleResult:
    """One example's detector values per head ([layers, heads] arrays; ``mass``, ``null_mass``
    and ``focus`` [layers, heads, docs]) and whether greedy decoding would answer it.

    ``mass`` / ``null_mass``: the question's / null question's attention summed over each
    document; ``focus``: QRHead's filtered document score of their per-token difference (what
    query focus and the heads' document rankings use); ``focus_all`` / ``focus_top`` [docs]:
    the same for the per-token sum over all heads / over the retriever's heads (an evaluation
    example's); ``write_evidence`` / ``write_off``: the write score's L+ and LOCOS's rescaled
    L-. ``current`` is False for a record from before QRHead's filter and LOCOS's rescaling
    (read for display only: ``focus`` is then the plain difference of masses, ``write_off``
    the unscaled write of the other context keys)."""

    id: str
    correct: bool
    copy: np.ndarray
    mass: np.ndarray
    null_mass: np.ndarray
    write_evidence: np.ndarray
    write_off: np.ndarray
    evidence: list[int]
    tokens: int
    focus: np.ndarray
    focus_all: np.ndarray | None = None
    focus_top: np.ndarray | None = None
    current: bool = True

    @property
    def query_focus(self) -> np.ndarray:
        return self.focus[:, :, self.evidence].sum(-1)

    @property
    def write(self) -> np.ndarray:
        return self.write_evidence - self.write_off

    def to_record(self) -> dict:
        return {
            "id": self.id,
            "correct": self.correct,
            "tokens": self.tokens,
            "evidence": self.evidence,
            "copy": self.copy.round(6).tolist(),
            "mass": self.mass.round(7).tolist(),
            "null_mass": self.null_mass.round(7).tolist(),
            "write_evidence": self.write_evidence.round(6).tolist(),
            "write_off": self.write_off.round(6).tolist(),
            "focus": self.focus.round(7).tolist(),
            **{name: getattr(self, name).round(7).tolist() for name in ("focus_all", "focus_top")
               if getattr(self, name) is not None},
        }  # fmt: skip

    @classmethod
    def from_record(cls, r: dict) -> ExampleResult:
        a = {k: np.asarray(r[k], float) for k in ("copy", "mass", "null_mass")}
        f = {k: np.asarray(r[k], float) for k in ("focus_all", "focus_top") if k in r}
        current = "focus" in r and "write_off" in r
        # an earlier record: its unfiltered masses and its unscaled context-only L- (display)
        focus = np.asarray(r["focus"], float) if "focus" in r else a["mass"] - a["null_mass"]
        off = np.asarray(r["write_off" if "write_off" in r else "write_other"], float)
        return cls(r["id"], bool(r["correct"]), **a, write_evidence=np.asarray(
            r["write_evidence"], float), write_off=off, evidence=r["evidence"],
            tokens=r["tokens"], focus=focus, current=current, **f)  # fmt: skip


def shared_prefix(enc: Encoded) -> int:
    """Tokens the teacher-forced and the null prompt share before either question: the
    documents' keys and values, which the null pass can take from the first pass's cache."""
    n = min(enc.question[0], enc.null_question[0])
    for i in range(n):
        if enc.ids[i] != enc.null_ids[i]:
            return i
    return n


def _full_cache(model: HookedModel):
    """A KV cache that keeps every key of every layer (sliding layers too: the model's mask
    applies their window; a cache that drops keys would move key 0), or None for a model
    with layers other than attention (a hybrid's recurrent state needs its own cache class;
    then both passes run whole)."""
    from transformers import DynamicCache

    if list(model.attention_layers) != list(range(model.n_layers)):
        return None
    return DynamicCache()


@torch.inference_mode()
def score_example(
    model: HookedModel,
    enc: Encoded,
    *,
    extra_hooks: Sequence[AttentionHook] = (),
    reuse_prefix: bool = True,
    retriever_heads: Sequence[tuple[int, int]] | None = None,
) -> ExampleResult:
    """The three detectors for one example: the teacher-forced pass and the null pass, and
    with ``retriever_heads`` those heads' document scores (``focus_top``).

    With ``reuse_prefix`` the documents run once: a pass over the shared prefix (BOS,
    instruction, documents) fills a KV cache, the teacher-forced suffix (question, frame,
    answer) runs on it, the cache is cut back to the prefix and the null suffix runs on it.
    The same numbers as two whole passes (tested), at about one pass's cost at long context.
    """
    from headhunt.sae.activations import output_projection

    dev = model.device
    a0, ids = enc.answer_start, enc.ids
    n_ans = len(ids) - a0
    answer_rows = (a0 - 1, len(ids) - 1)  # row t predicts answer token t
    cap = TaskCapture(enc.doc_spans, enc.evidence, enc.question, answer_rows)
    norm = final_norm(model)
    p = shared_prefix(enc) if reuse_prefix else 0
    cache = _full_cache(model) if p > 0 else None
    if cache is None:
        p = 0
    kv: dict = {"use_cache": False}
    if cache is not None:  # newer transformers call the argument `cache`
        takes = inspect.signature(model.model.forward).parameters
        kv = {"use_cache": True, "cache" if "cache" in takes else "past_key_values": cache}
    if p:
        with model.hooks(*extra_hooks):
            model.forward(torch.tensor([ids[:p]], device=dev), logits_to_keep=1, **kv)
    resid = _FinalResidual(norm, answer_rows, offset=p)
    try:
        with model.hooks(cap, *extra_hooks):
            out = model.forward(torch.tensor([ids[p:]], device=dev),
                                logits_to_keep=n_ans + 1, **kv)  # fmt: skip
    finally:
        resid.handle.remove()
    logits = out.logits[0, :n_ans].float()
    gold = torch.tensor(ids[a0:], device=logits.device)
    correct = bool((logits.argmax(-1) == gold).all())
    del out

    null = TaskCapture(enc.doc_spans, enc.evidence, enc.null_question)
    if cache is not None:  # (a negative count removes tokens in every transformers 5)
        cache.crop(-(cache.get_seq_length() - p))
    with model.hooks(null):
        model.forward(torch.tensor([enc.null_ids[p:]], device=dev), logits_to_keep=1, **kv)
    del cache, kv

    L, H = model.n_layers, model.n_heads
    ids_t = torch.tensor(ids)
    lo, hi = cap.lo, cap.hi
    spans = [(s - lo, e - lo) for s, e in enc.doc_spans]
    focus = np.zeros((L, H, len(spans)))
    on = next(iter(cap.tokens.values())).device  # (--device-map: the first layer's GPU)
    all_heads, top = torch.zeros(hi - lo, device=on), torch.zeros(hi - lo, device=on)
    for layer in range(L):  # a layer at a time: per-token scores are heads x context keys
        calibrated = (cap.tokens.pop(layer) - null.tokens.pop(layer)).to(on)  # [hq, keys]
        focus[layer] = qr_document_scores(calibrated, spans).cpu().numpy()
        all_heads += calibrated.sum(0)
        for la, h in retriever_heads or ():
            if la == layer:
                top += calibrated[h]
    copy = np.zeros((L, H))
    w_ev, w_off = np.zeros((L, H)), np.zeros((L, H))
    direction = write_directions(model, norm, resid.x, gold)  # [answer, d_model]
    for layer in range(L):
        pos = cap.argmax[layer]  # [hq, answer]
        inside = (pos >= lo) & (pos < hi)
        ev = torch.zeros_like(inside)
        ev[inside] = cap.on_evidence[(pos[inside] - lo)]
        same = ids_t[pos.clamp(0, len(ids) - 1)] == gold.cpu()[None]
        copy[layer] = (ev & same).float().mean(1).numpy()
        w_o = output_projection(model, layer).float()
        w_h = w_o.view(w_o.shape[0], H, -1)  # [d_model, hq, d]
        per_head = torch.einsum("mhd,rm->rhd", w_h, direction.to(w_o.device)).cpu()
        w_ev[layer] = (cap.z_evidence[layer] * per_head).sum(-1).mean(0).numpy()
        off = (cap.z_off[layer] * per_head).sum(-1) * cap.off_scale[layer][:, None]
        w_off[layer] = off.mean(0).numpy()
    return ExampleResult(
        id=enc.id,
        correct=correct,
        copy=copy,
        mass=np.stack([cap.mass[i].numpy() for i in range(L)]),
        null_mass=np.stack([null.mass[i].numpy() for i in range(L)]),
        write_evidence=w_ev,
        write_off=w_off,
        evidence=list(enc.evidence),
        tokens=len(ids),
        focus=focus,
        focus_all=qr_document_scores(all_heads, spans).cpu().numpy(),
        focus_top=None if retriever_heads is None else qr_document_scores(top, spans).cpu().numpy(),
    )


def write_directions(
    model: HookedModel, norm: torch.nn.Module, x: Float[Tensor, "rows d_model"], gold: Tensor
) -> Float[Tensor, "rows d_model"]:
    """``g * U[gold_t] / rms(x_t)``: a residual vector's dot product with it is its part of the
    gold logit with the final norm's scale frozen at the real residual ``x_t``."""
    unembed = model.model.get_output_embeddings().weight.detach()
    u = unembed[gold.to(unembed.device)].float()
    g = norm_gain(norm, model.d_model).to(u.device)
    return u * g[None] / rms(norm, x.to(u.device))[:, None]


# ---------------------------------------------------------------- heads over examples


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (NaN for none; SE 0 for one value)."""
    a = np.asarray(values, float)
    if a.size == 0:
        return float("nan"), float("nan")
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else 0.0
    return float(a.mean()), se


def ranking_metrics(
    scores: np.ndarray, relevant: Sequence[int], k: int = 10
) -> tuple[float, float]:
    """(recall@1, NDCG@k) of ranking documents by ``scores`` (binary relevance; ties broken by
    document order, so a constant score ranks the first document first)."""
    order = np.argsort(-np.asarray(scores, float), kind="stable")
    rel = set(relevant)
    gains = [1.0 / math.log2(i + 2) for i, d in enumerate(order[:k]) if d in rel]
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(rel))))
    return float(order[0] in rel), float(sum(gains) / ideal) if ideal else float("nan")


def head_matrices(results: Sequence[ExampleResult]) -> dict[str, np.ndarray]:
    """Per-head scores over examples: copy_score, query_focus, query_recall1, query_ndcg10
    (examples with two documents or more), write_score (correct examples only: NaN when the
    model answered none)."""
    L, H = results[0].copy.shape
    out = {
        "copy_score": np.mean([r.copy for r in results], 0),
        "query_focus": np.mean([r.query_focus for r in results], 0),
    }
    multi = [r for r in results if r.mass.shape[-1] > 1]
    rec, ndcg = np.full((L, H), np.nan), np.full((L, H), np.nan)
    if multi:
        m = np.array([[[ranking_metrics(r.focus[la, h], r.evidence) for h in range(H)]
                       for la in range(L)] for r in multi])  # fmt: skip
        rec, ndcg = m[..., 0].mean(0), m[..., 1].mean(0)
    out["query_recall1"], out["query_ndcg10"] = rec, ndcg
    right = [r.write for r in results if r.correct]
    out["write_score"] = np.mean(right, 0) if right else np.full((L, H), np.nan)
    return out


def top_heads(matrix: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The ``k`` highest heads of a [layers, heads] matrix (NaN last; ties by position)."""
    flat = np.nan_to_num(np.asarray(matrix, float).ravel(), nan=-np.inf)
    order = np.argsort(-flat, kind="stable")[:k]
    H = matrix.shape[1]
    return [(int(i // H), int(i % H)) for i in order]


def retrieval_table(
    results: Sequence[ExampleResult],
    texts: dict[str, tuple[list[str], str]] | None = None,
) -> dict[str, dict[str, float]]:
    """Document retrieval on examples with several documents (each scored with the retriever's
    heads: ``focus_top``): rank by those heads' QRHead document scores, by all heads'
    (``focus_all``), and (``texts``: id -> documents and question; needs ``bm25s``) by BM25.
    Mean and SE of recall@1 and NDCG@10 per retriever."""
    multi = [r for r in results if r.mass.shape[-1] > 1]
    if any(r.focus_top is None or r.focus_all is None for r in multi):
        raise HeadhuntError("retrieval needs examples scored with the retriever's heads")
    rankers = {"top heads": lambda r: r.focus_top, "all heads": lambda r: r.focus_all}
    if texts is not None:
        rankers["bm25"] = lambda r: bm25_scores(*texts[r.id])
    return {name: retrieval_metrics(multi, rank) for name, rank in rankers.items()}


def retrieval_metrics(results: Sequence[ExampleResult], rank) -> dict[str, float]:
    """Mean and SE of recall@1 and NDCG@10 of ``rank(result)`` (document scores) over the
    examples with several documents."""
    m = [ranking_metrics(rank(r), r.evidence) for r in results if r.mass.shape[-1] > 1]
    r1, r1_se = mean_se([x[0] for x in m])
    nd, nd_se = mean_se([x[1] for x in m])
    return {"recall1": r1, "recall1_se": r1_se, "ndcg10": nd, "ndcg10_se": nd_se,
            "examples": len(m)}  # fmt: skip


def bm25_scores(documents: list[str], question: str) -> np.ndarray:
    """BM25 (``bm25s``, Lucene's variant) score of each document for the question."""
    try:
        import bm25s
    except ImportError:
        raise HeadhuntError("BM25 needs bm25s (pip install 'headhunt[retriever]')") from None
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(documents, stopwords="en", show_progress=False),
                    show_progress=False)  # fmt: skip
    query = bm25s.tokenize([question], stopwords="en", show_progress=False)
    docs, scores = retriever.retrieve(query, k=len(documents), show_progress=False)
    out = np.zeros(len(documents))
    out[docs[0]] = scores[0]
    return out
