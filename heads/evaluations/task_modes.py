"""The causal check's ablations of a head's output (before ``o_proj``), in one registry: the
method's ``--modes`` choices and :func:`headhunt.heads.evaluations.task_ablation.ablation` both
read it. Torch-free, so a config can name the choices without loading torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AblationMode:
    """What one ablation puts in a head's output, and at which rows.

    Attributes:
        what: one line for the CLI and the docs.
        mean: a reference mean goes in (else 0).
        rows: ``all`` (every row), ``after-first`` (every row but the first, the attention
            sink) or ``readout`` (the rows from the question's first token through the answer:
            the rows that read the context and produce the answer; the context rows keep the
            head's own output).
    """

    what: str
    mean: bool
    rows: str


MODES: dict[str, AblationMode] = {
    "mean": AblationMode(
        "every row: the head's mean over every row of the reference set (LOCOS)", True, "all"
    ),
    "mean-keep-first": AblationMode(
        "every row but the first (the attention sink): the mean over those rows",
        True,
        "after-first",
    ),  # fmt: skip
    "zero": AblationMode("every row: 0", False, "all"),
    "mean-readout": AblationMode(
        "the question and answer rows only (the context rows keep their own output): the "
        "mean over the reference set's question and answer rows",
        True,
        "readout",
    ),  # fmt: skip
    "zero-readout": AblationMode("the question and answer rows only: 0", False, "readout"),
}
