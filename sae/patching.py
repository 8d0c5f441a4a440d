"""Ground truth and the fast baseline: per-head activation patching and attribution patching.

The task metric on one pair is the logit difference at the last position,
``m = logsumexp(logits[answer]) - logsumexp(logits[wrong])`` (with one answer and one wrong
token, the plain logit difference).

- Activation patching (the ground truth): run the negative (corrupted) prompt with one head's
  output (before the output projection, at every position) replaced by its value on the
  positive (clean) prompt; the head's effect is the mean change of ``m`` over pairs. Heads whose
  clean output restores the clean behaviour carry the task.
- Attribution patching (EAP): the first-order estimate of the same effect from one clean
  forward, one corrupted forward and one backward: sum over positions of
  ``(z_clean - z_corrupt) . dm/dz`` at the corrupted run.

Speed: a head in layer l can only change layers l and above, so patching runs from the
corrupted residual stream at layer l's input through the remaining layers (and the LM head at
the last position only), with all heads of a layer patched in one batched pass. This shortcut is
checked against a full forward on the model at hand and dropped if they disagree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn
from tqdm.auto import tqdm

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.sae.prompt_pairs import EncodedPairs, length_batches


def _index_sets(sets: list[list[int]], device) -> tuple[Tensor, Tensor]:
    width = max(len(s) for s in sets)
    idx = torch.zeros(len(sets), width, dtype=torch.long)
    mask = torch.zeros(len(sets), width, dtype=torch.bool)
    for i, s in enumerate(sets):
        idx[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = True
    return idx.to(device), mask.to(device)


def logit_diff(
    last_logits: Float[Tensor, "b vocab"], answer: list[list[int]], wrong: list[list[int]]
) -> Float[Tensor, " b"]:
    """logsumexp of the answer logits minus logsumexp of the wrong ones, per row."""
    out = []
    for sets in (answer, wrong):
        idx, mask = _index_sets(sets, last_logits.device)
        vals = last_logits.gather(1, idx).masked_fill(~mask, float("-inf"))
        out.append(torch.logsumexp(vals.float(), 1))
    return out[0] - out[1]


class _Record(AttentionHook):
    """Keeps every layer's pre-projection output z [b, n, heads, d]."""

    def __init__(self):
        self.z: dict[int, Tensor] = {}

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        self.z[call.layer] = output.detach()
        return output


class _PatchOneHeadPerCopy(AttentionHook):
    """The input batch is ``heads`` copies of b prompts; copy k gets head k's clean output."""

    def __init__(self, clean: Tensor, heads: list[int]):
        self.clean = clean  # [b, n, heads, d]
        self.heads = heads

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        b = self.clean.shape[0]
        output = output.clone()
        for k, h in enumerate(self.heads):
            output[k * b : (k + 1) * b, :, h] = self.clean[:, :, h]
        return output


@contextlib.contextmanager
def _from_layer(model: HookedModel, start: int) -> Iterator[None]:
    """Inside the block the model runs only layers ``start``.. (fed ``inputs_embeds``)."""
    full = model.blocks
    owner, name = next(
        (owner, name)
        for owner in model.model.modules()
        for name, child in owner.named_children()
        if child is full
    )
    setattr(owner, name, nn.ModuleList(list(full)[start:]))
    try:
        yield
    finally:
        setattr(owner, name, full)


def _last_logits(model: HookedModel, **kw) -> Tensor:
    return model.model(use_cache=False, logits_to_keep=1, **kw).logits[:, -1]


@dataclass
class PatchingResult:
    """Per-head activation patching effects.

    Attributes:
        effect: [layers, heads] mean over pairs of m(corrupted with the head's clean output) -
            m(corrupted): how much of the task metric this head alone restores, in logits.
        clean_metric, corrupt_metric: mean m on positives and on negatives.
        shortcut: whether the run-from-layer-l shortcut was used (it matched a full forward).
    """

    effect: Float[Tensor, "layers heads"]
    clean_metric: float
    corrupt_metric: float
    shortcut: bool

    @property
    def normalised(self) -> Float[Tensor, "layers heads"]:
        """Effect as a share of the clean - corrupted gap (1 = this head alone restores all)."""
        gap = self.clean_metric - self.corrupt_metric
        return self.effect / (gap if abs(gap) > 1e-6 else 1.0)


def _require_pairs(pairs: EncodedPairs) -> None:
    if len(pairs) == 0:
        raise HeadhuntError("no prompt pairs to patch")
    if not pairs.has_answers:
        raise HeadhuntError("patching needs 'answer' and 'wrong' for every pair")
    if not pairs.aligned:
        raise HeadhuntError("patching needs every positive and negative of equal token length")


@torch.inference_mode()
def activation_patching(
    model: HookedModel,
    pairs: EncodedPairs,
    *,
    batch_size: int = 8,
    layers: Sequence[int] | None = None,
    shortcut: bool = True,
    progress: bool = True,
) -> PatchingResult:
    """Per-head activation patching, clean into corrupted, for every head of the model.

    Args:
        model: the hooked model.
        pairs: aligned prompt pairs with answers.
        batch_size: pairs per pass (a pass holds n_heads copies of them).
        layers: patch only these layers' heads (default all); other heads get effect 0.
        shortcut: run only the layers a patch can change (verified, see the module docstring).
        progress: show a progress bar over layers.
    """
    _require_pairs(pairs)
    L, H = model.n_layers, model.n_heads
    chosen = list(range(L)) if layers is None else sorted(set(layers))
    if any(not 0 <= i < L for i in chosen):
        raise HeadhuntError(f"layers must be in 0..{L - 1}, got {list(layers or [])}")
    total = torch.zeros(L, H, dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    groups = list(length_batches(pairs.positive, batch_size))
    use_shortcut, checked = shortcut, False
    bar = tqdm(total=len(groups) * len(chosen), desc="patching", disable=not progress, leave=False)
    for idx, pos in groups:
        neg = torch.stack([pairs.negative[i] for i in idx]).to(model.device)
        pos = pos.to(model.device)
        ans, wrong = [pairs.answer[i] for i in idx], [pairs.wrong[i] for i in idx]
        rec = _Record()
        with model.hooks(rec):
            m_clean = logit_diff(_last_logits(model, input_ids=pos), ans, wrong)
        out = model.model(
            input_ids=neg, use_cache=False, logits_to_keep=1, output_hidden_states=True
        )
        resid = out.hidden_states  # resid[l]: the input of layer l
        m_corrupt = logit_diff(out.logits[:, -1], ans, wrong)
        clean_sum += float(m_clean.sum())
        corrupt_sum += float(m_corrupt.sum())
        if use_shortcut and not checked:  # once: it is a property of the model
            use_shortcut = _shortcut_ok(model, resid, out.logits[:, -1])
            checked = True
        b = len(idx)
        for layer in chosen:
            hook = _PatchOneHeadPerCopy(rec.z[layer], list(range(H)))
            with model.hooks(hook, layers=[layer]):
                if use_shortcut:
                    with _from_layer(model, layer):
                        logits = _last_logits(model, inputs_embeds=resid[layer].repeat(H, 1, 1))
                else:
                    logits = _last_logits(model, input_ids=neg.repeat(H, 1))
            m = logit_diff(logits, ans * H, wrong * H).reshape(H, b)
            total[layer] += (m - m_corrupt[None]).sum(1).double().cpu()
            bar.update()
    bar.close()
    n = len(pairs)
    return PatchingResult(
        effect=(total / n).float(),
        clean_metric=clean_sum / n,
        corrupt_metric=corrupt_sum / n,
        shortcut=use_shortcut,
    )


def _shortcut_ok(model: HookedModel, resid: tuple[Tensor, ...], full_last: Tensor) -> bool:
    """Does running from a middle layer's input reproduce the full forward's last logits?"""
    mid = model.n_layers // 2
    try:
        with _from_layer(model, mid):
            got = _last_logits(model, inputs_embeds=resid[mid])
    except (HeadhuntError, TypeError, ValueError, RuntimeError):
        return False
    return bool(torch.allclose(got, full_last, atol=1e-3 * (1 + float(full_last.abs().max()))))


class _Attribution(AttentionHook):
    """Adds a zero leaf to every layer's z, so autograd gives dm/dz per layer."""

    def __init__(self):
        self.delta: dict[int, Tensor] = {}
        self.z: dict[int, Tensor] = {}

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        d = torch.zeros_like(output, requires_grad=True)
        self.delta[call.layer] = d
        self.z[call.layer] = output.detach()
        return output + d


def attribution_patching(
    model: HookedModel,
    pairs: EncodedPairs,
    *,
    batch_size: int = 16,
    per_pair: bool = False,
    progress: bool = False,
) -> Float[Tensor, "layers heads"] | Float[Tensor, "pairs layers heads"]:
    """EAP score of every head: sum over positions and dims of (z_clean - z_corrupt) . dm/dz
    (gradient at the corrupted run), averaged over pairs; the linear estimate of the patching
    effect, in logits, with the same sign convention.

    Args:
        model: the hooked model.
        pairs: aligned prompt pairs with answers.
        batch_size: pairs per forward/backward.
        per_pair: return one [layers, heads] matrix per pair instead of their mean (each pair's
            score depends only on that pair, so the mean over any subset is that subset's EAP).
        progress: show a progress bar.
    """
    _require_pairs(pairs)
    L, H = model.n_layers, model.n_heads
    out = torch.zeros(len(pairs), L, H, dtype=torch.float32)
    groups = list(length_batches(pairs.positive, batch_size))
    for idx, pos in tqdm(groups, desc="EAP", disable=not progress, leave=False):
        neg = torch.stack([pairs.negative[i] for i in idx]).to(model.device)
        ans, wrong = [pairs.answer[i] for i in idx], [pairs.wrong[i] for i in idx]
        rec = _Record()
        with torch.inference_mode(), model.hooks(rec):
            _last_logits(model, input_ids=pos.to(model.device))
        grad_hook = _Attribution()
        with torch.enable_grad(), model.hooks(grad_hook):
            m = logit_diff(_last_logits(model, input_ids=neg), ans, wrong)
            layers = sorted(grad_hook.delta)
            grads = torch.autograd.grad(m.sum(), [grad_hook.delta[i] for i in layers])
        with torch.no_grad():
            for layer, g in zip(layers, grads, strict=True):
                diff = rec.z[layer].float() - grad_hook.z[layer].float()
                out[idx, layer] = (diff * g.float()).sum((1, 3)).cpu()
    return out if per_pair else out.mean(0)
