"""A needle-in-a-haystack answer with heads masked or calibrated (on demand, one prompt)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from headhunt.errors import HeadhuntError
from headhunt.scores import Head


def needle_trial(
    model,
    *,
    length: int = 400,
    depth: float = 50.0,
    needle: str = "passkey",
    seed: int = 0,
    haystack: str | None = None,
):
    """One needle-in-a-haystack prompt of exactly ``length`` tokens, built as the retrieval
    analyzer builds its trials (a :class:`headhunt.heads.inputs.needles.NeedleTrial`)."""
    from headhunt.heads.inputs.needles import NEEDLES, TrialBuilder, read_haystack

    if needle not in NEEDLES:
        raise HeadhuntError(f"unknown needle {needle!r} (choose from {', '.join(NEEDLES)})")
    if not 0 <= depth <= 100:
        raise HeadhuntError(f"depth {depth} is outside 0..100 (percent)")
    if not 64 <= length <= model.max_context - 32:  # room for the answer's tokens
        raise HeadhuntError(
            f"a needle prompt needs 64 to {model.max_context - 32} tokens on this model, "
            f"not {length}"
        )
    builder = TrialBuilder(model.tokenizer, read_haystack(haystack))
    tid = f"L{length}-D{depth:g}-{needle}-s{seed}"
    return builder.build(length, depth / 100, NEEDLES[needle], random.Random(f"{seed}/{tid}"), tid)


@dataclass
class Answer:
    """The model's greedy answer to a needle prompt under one condition."""

    condition: str
    text: str
    recall: float  # ROUGE-1 recall of the needle's answer in the response
    heads: list[Head]

    @property
    def correct(self) -> bool:
        return self.recall > 0.5  # the retrieval analyzer's rule for a counted trial


Intervention = Literal["none", "mask", "act"]


def answer_needle(
    model,
    trial,
    *,
    heads: Sequence[Head] = (),
    how: Intervention = "none",
    mask_mode: str = "query",
    act_beta: float = 0.4,
    max_new_tokens: int = 24,
) -> Answer:
    """Greedy answer to ``trial`` with ``heads`` masked (:func:`headhunt.heads.interventions.masking.mask_heads`)
    or calibrated (:func:`headhunt.heads.interventions.act.act_calibration`), or untouched (``how="none"``)."""
    import torch

    from headhunt.heads.inputs.needles import rouge1_recall
    from headhunt.heads.retrieval import stop_token_ids
    from headhunt.probes.capture import greedy_decode

    heads = [(int(la), int(h)) for la, h in heads]
    if how not in ("none", "mask", "act"):
        raise HeadhuntError(f"unknown intervention {how!r} (use none, mask or act)")
    if how != "none" and not heads:
        raise HeadhuntError("choose at least one head to intervene on")
    stop = stop_token_ids(model.tokenizer)
    with _intervention(model, heads, how, mask_mode, act_beta):
        dec = greedy_decode(
            model, torch.tensor([trial.input_ids]), max_new_tokens=max_new_tokens, stop_ids=stop
        )
    ids = [x for x in dec.tokens[0, : int(dec.lengths[0])].tolist() if x not in stop]
    text = model.tokenizer.decode(ids, skip_special_tokens=True)
    label = {"none": "unchanged", "mask": f"{mask_mode} mask", "act": f"ACT beta={act_beta:g}"}
    return Answer(
        label[how], text, rouge1_recall(trial.answer, text), heads if how != "none" else []
    )


@contextlib.contextmanager
def _intervention(model, heads: list[Head], how: str, mask_mode: str, act_beta: float):
    if how == "mask":
        from headhunt.heads.interventions.masking import mask_heads

        with mask_heads(model, heads, mode=mask_mode):  # type: ignore[arg-type]
            yield
    elif how == "act":
        from headhunt.heads.interventions.act import ActConfig, act_calibration

        with act_calibration(model, heads, ActConfig(beta=act_beta)):
            yield
    else:
        yield


def compare_answers(
    model, trial, heads: Sequence[Head], how: Intervention, **kw
) -> tuple[Answer, Answer]:
    """The answer before (no intervention) and after masking or calibrating ``heads``."""
    return answer_needle(model, trial, **kw), answer_needle(
        model, trial, heads=heads, how=how, **kw
    )


def random_heads_like(model, heads: Sequence[Head], seed: int = 0) -> list[Head]:
    """As many random heads as ``heads``, none of them (the control of a masking check)."""
    from headhunt.heads.evaluations.causal import random_head_sets

    return random_head_sets(
        getattr(model, "attention_layers", model.n_layers),  # a hybrid: its attention layers
        model.n_heads,
        len(heads),
        1,
        exclude=heads,
        seed=random.Random(seed),
    )[0]
