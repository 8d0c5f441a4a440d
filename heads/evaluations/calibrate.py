"""Choosing heads for ACT calibration and measuring it honestly on held-out items.

Protocol (Yu et al. 2024 choose heads one at a time on a calibration set; their selection
rule is not published, so this one is ours and stated here):

1. Split the task (seeded) into calibration / dev / test.
2. Candidates: every (layer, head) outside the excluded layers (0, 1 and the last by
   default), ranked by their *movable sink mass*: the attention that ACT would take off the
   head's hidden sinks at the scored (last) prompt position, averaged over calibration
   prompts. Heads with no movable mass cannot be changed by ACT; ``max_heads`` keeps the top.
3. Screening: calibrate each candidate alone on the calibration split; keep heads whose
   accuracy gain is > 0 (ties broken by the gain in the log-probability of the right answer).
4. Greedy combination on dev: walk the kept heads best first, add a head when dev accuracy
   rises strictly.
5. Report baseline vs calibrated accuracy on the test split only, with a paired bootstrap
   confidence interval of each accuracy and of the difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from headhunt.errors import HeadhuntError
from headhunt.heads.configs import CalibrateConfig  # noqa: F401  (its config)
from headhunt.heads.inputs.calibration_tasks import Task
from headhunt.heads.interventions.act import ActConfig, act_calibration
from headhunt.probes.hooked import HookedModel
from headhunt.scores import Head


@dataclass
class EncodedTask:
    """A task's prompts as token ids, the scored token of each choice, and the answers."""

    name: str
    ids: list[Int[Tensor, " n"]]
    choice_ids: list[list[int]]
    answers: list[int]

    def __len__(self) -> int:
        return len(self.ids)


def encode_task(model: HookedModel, task: Task) -> EncodedTask:
    """Tokenize every prompt and choice.

    Raises:
        HeadhuntError: a prompt longer than the model's context; two choices of an item
            starting with the same token (the argmax could not tell them apart).
    """
    tok = model.tokenizer
    ids, choice_ids, answers = [], [], []
    cache: dict[str, int] = {}
    for i, item in enumerate(task.items):
        x = model.encode(item.prompt)
        if len(x) > model.max_context:
            raise HeadhuntError(
                f"item {i} of task {task.name} has {len(x)} tokens, more than the model's "
                f"context ({model.max_context})"
            )
        firsts = []
        for c in item.choices:
            if c not in cache:
                t = tok(c, add_special_tokens=False).input_ids
                if not t:
                    raise HeadhuntError(f"choice {c!r} of task {task.name} has no tokens")
                cache[c] = t[0]
            firsts.append(cache[c])
        if len(set(firsts)) != len(firsts):
            dup = [c.strip() for c in item.choices if firsts.count(cache[c]) > 1]
            raise HeadhuntError(
                f"task {task.name}: choices {dup} start with the same token; rename them"
            )
        ids.append(x)
        choice_ids.append(firsts)
        answers.append(item.answer)
    return EncodedTask(task.name, ids, choice_ids, answers)


@dataclass
class Scored:
    """Per-item outcome of an evaluation.

    Attributes:
        correct: 1 where the argmax over the choices is the right answer.
        logprob: log-probability of the right choice, renormalised over the choices.
    """

    correct: np.ndarray
    logprob: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean()) if len(self.correct) else float("nan")

    @property
    def mean_logprob(self) -> float:
        return float(self.logprob.mean()) if len(self.logprob) else float("nan")


@torch.inference_mode()
def evaluate(
    model: HookedModel,
    enc: EncodedTask,
    indices: Sequence[int],
    *,
    heads: Iterable[Head] = (),
    act: ActConfig | None = None,
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> Scored:
    """Zero-shot accuracy on ``indices`` with ACT on ``heads`` (none: the plain model).

    Prompts are batched by length with right padding and no mask: under the causal mask a
    real token never sees the padding after it, so each row's last real position gives the
    same logits as running the prompt alone. Only those positions go through the LM head.
    """
    heads = list(heads)
    order = sorted(indices, key=lambda i: len(enc.ids[i]))
    correct = dict.fromkeys(indices, 0)
    logprob = dict.fromkeys(indices, 0.0)
    with act_calibration(model, heads, act):
        for b0 in range(0, len(order), batch_size):
            batch = order[b0 : b0 + batch_size]
            x, last = _right_padded(model, enc, batch)
            keep, where = torch.unique(last, return_inverse=True)
            # A list, not a tensor: accelerate would move a tensor to the first GPU, while under
            # --device-map the last hidden state it indexes sits on the last layer's GPU.
            out = model.forward(x, use_cache=False, logits_to_keep=keep.tolist())
            logits = out.logits[torch.arange(len(batch)), where.cpu()].float().cpu()
            for r, i in enumerate(batch):
                scores = logits[r, enc.choice_ids[i]].log_softmax(-1)
                correct[i] = int(int(scores.argmax()) == enc.answers[i])
                logprob[i] = float(scores[enc.answers[i]])
            if progress is not None:
                progress(len(batch))
    return Scored(
        correct=np.array([correct[i] for i in indices]),
        logprob=np.array([logprob[i] for i in indices]),
    )


@torch.inference_mode()
def movable_sink_mass(
    model: HookedModel,
    enc: EncodedTask,
    indices: Sequence[int],
    act: ActConfig,
    layers: Sequence[int],
    batch_size: int = 16,
) -> np.ndarray:
    """[layers, heads] mean attention on the hidden sinks (the mass ACT would scale by beta)
    at each prompt's last position, from an ACT pass with beta = 1 (which changes nothing)."""
    probe = ActConfig(beta=1.0, tau=act.tau, min_queries=act.min_queries)
    heads = [(layer, h) for layer in layers for h in range(model.n_heads)]
    total = np.zeros((model.n_layers, model.n_heads))
    for b0 in range(0, len(indices), batch_size):
        batch = list(indices[b0 : b0 + batch_size])
        x, last = _right_padded(model, enc, batch)
        with act_calibration(model, heads, probe) as hook:
            model.forward(x, use_cache=False, logits_to_keep=1)
        rows = torch.arange(len(batch))
        for layer in layers:
            total[layer] += hook.sink_mass[layer][rows, :, last].sum(0).float().cpu().numpy()
    return total / max(1, len(indices))


def _right_padded(
    model: HookedModel, enc: EncodedTask, batch: Sequence[int]
) -> tuple[Int[Tensor, "b n"], Int[Tensor, " b"]]:
    """A right-padded batch (no mask needed under causality) and each row's last position."""
    pad = model.tokenizer.pad_token_id
    lens = torch.tensor([len(enc.ids[i]) for i in batch])
    x = torch.full((len(batch), int(lens.max())), 0 if pad is None else pad, dtype=torch.long)
    for r, i in enumerate(batch):
        x[r, : lens[r]] = enc.ids[i]
    return x, lens - 1


def rank_candidates(mass: np.ndarray, excluded: Sequence[int], max_heads: int) -> list[Head]:
    """Heads with movable mass > 0 outside ``excluded``, largest mass first, at most max."""
    order = np.argsort(-mass, axis=None, kind="stable")
    out = []
    for flat in order:
        layer, head = divmod(int(flat), mass.shape[1])
        if layer in excluded or mass[layer, head] <= 0:
            continue
        out.append((layer, head))
        if len(out) == max_heads:
            break
    return out


def keep_helpful(screen: Sequence[dict[str, Any]], base_acc: float) -> list[Head]:
    """Screened heads with an accuracy gain > 0 on the calibration split, best first
    (accuracy gain, then log-probability gain)."""
    rows = [r for r in screen if r["acc"] > base_acc]
    rows.sort(key=lambda r: (r["acc"], r["logprob"]), reverse=True)
    return [(int(r["layer"]), int(r["head"])) for r in rows]


Evaluator = Callable[..., dict[str, Any]]


@dataclass
class Search:
    """Outcome of the head search.

    Attributes:
        screen: one record per candidate (``layer``, ``head``, ``acc``, ``logprob``) on the
            calibration split.
        kept: candidates that raised calibration accuracy, best first.
        greedy: one record per greedy step on dev (``acc``, ``accepted``).
        chosen: the final head set.
        calib_base, dev_base: baseline records of the two splits.
    """

    screen: list[dict[str, Any]]
    kept: list[Head]
    greedy: list[dict[str, Any]]
    chosen: list[Head]
    calib_base: dict[str, Any]
    dev_base: dict[str, Any]


def search_heads(
    evaluate: Evaluator,
    candidates: Sequence[Head],
    calibration: Sequence[int],
    dev: Sequence[int],
    on_head: Callable[[int, int], None] | None = None,
) -> Search:
    """Screen ``candidates`` one at a time on the calibration split, then combine greedily
    on dev.

    Args:
        evaluate: ``evaluate(key, indices, heads, **extra) -> {"acc", "logprob", "correct",
            ...}``; ``key`` names the evaluation (``("screen", layer, head)``,
            ``("greedy", step)``, ``("calib_base",)``, ``("dev_base",)``) so a caller can
            keep and reuse finished ones (resuming).
        candidates: heads to screen, in order.
        calibration, dev: item indices of the two splits.
        on_head: called with (done, total) after each screened head (progress).
    """
    calib_base = evaluate(("calib_base",), calibration, [])
    screen = []
    for i, (layer, head) in enumerate(candidates):
        rec = evaluate(
            ("screen", layer, head), calibration, [(layer, head)], layer=layer, head=head
        )
        screen.append({**rec, "layer": layer, "head": head})
        if on_head is not None:
            on_head(i + 1, len(candidates))
    kept = keep_helpful(screen, calib_base["acc"])
    dev_base = evaluate(("dev_base",), dev, [])
    chosen: list[Head] = []
    best = dev_base["acc"]
    greedy = []
    for i, h in enumerate(kept):
        rec = evaluate(("greedy", i), dev, [*chosen, h], step=i, layer=h[0], head=h[1])
        accepted = rec["acc"] > best
        greedy.append({**rec, "layer": h[0], "head": h[1], "accepted": accepted})
        if accepted:
            chosen, best = [*chosen, h], rec["acc"]
    return Search(screen, kept, greedy, chosen, calib_base, dev_base)


@dataclass
class Bootstrap:
    """Paired bootstrap over test items: point estimates and 95% percentile intervals."""

    baseline: float
    calibrated: float
    gain: float
    baseline_ci: tuple[float, float]
    calibrated_ci: tuple[float, float]
    gain_ci: tuple[float, float]
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired_bootstrap(base: np.ndarray, cal: np.ndarray, n_boot: int, seed: int) -> Bootstrap:
    """Resample test items with replacement (same items for both arms)."""
    base, cal = np.asarray(base, float), np.asarray(cal, float)
    n = len(base)
    if n == 0 or len(cal) != n:
        raise HeadhuntError("bootstrap needs two equal, non-empty outcome vectors")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    b, c = base[idx].mean(1), cal[idx].mean(1)

    def ci(x: np.ndarray) -> tuple[float, float]:
        lo, hi = np.percentile(x, [2.5, 97.5])
        return float(lo), float(hi)

    return Bootstrap(
        baseline=float(base.mean()),
        calibrated=float(cal.mean()),
        gain=float(cal.mean() - base.mean()),
        baseline_ci=ci(b),
        calibrated_ci=ci(c),
        gain_ci=ci(c - b),
        n=n,
    )
