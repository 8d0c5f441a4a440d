"""The configs of the capture layer's states and of the linear probes fitted on them: each the
library's config and a part of the probe method's (its ``ProbeRunConfig`` derives from
:class:`CaptureConfig` and :class:`ProbeFitting`, so each field is declared once). Kept apart
from the capture and the prober so that the CLI's ``--help`` reads them without importing torch
or scikit-learn.
"""

from __future__ import annotations

from dataclasses import dataclass

from headhunt.config import MethodConfig, option
from headhunt.errors import HeadhuntError

STATE_DTYPES = ("float32", "float16")


@dataclass
class CaptureConfig(MethodConfig):
    """How states are captured (:func:`headhunt.probes.states.capture_states`).

    Attributes:
        layers: decoder layers to keep (0-based; None = all). Layer L's state is the residual
            stream after decoder layer L.
        heads: also keep each head's attention output (pre-``o_proj``) per chosen layer.
        batch_size: texts per forward pass.
        shard_size: texts per shard on disk (memory holds one shard's rows at a time).
        state_dtype: storage dtype, ``float32`` or ``float16`` (half the disk; fine for
            probing unless a model has activations beyond float16's range).
    """

    layers: list[int] | None = option(None, "layers (default all)", type=int)
    heads: bool = option(False, "also capture and probe every head's output")
    batch_size: int = option(8, "texts per forward pass", min=1)
    shard_size: int = option(64, "texts per shard on disk", min=1)
    state_dtype: str = option("float32", "stored states", choices=STATE_DTYPES)

    def stored(self) -> dict:
        """What a store records of its capture, under the keys it always had (batch size
        changes nothing stored, so a resumed capture may use another one)."""
        return {
            "layers": self.layers,
            "heads": self.heads,
            "shard_size": self.shard_size,
            "dtype": self.state_dtype,
        }

    def layer_list(self, n_layers: int) -> list[int]:
        """The sorted layers to capture of a model with ``n_layers`` layers."""
        layers = list(range(n_layers)) if self.layers is None else sorted(set(self.layers))
        bad = [x for x in layers if not 0 <= x < n_layers]
        if bad or not layers:
            raise HeadhuntError(
                f"layers {bad or '[]'} do not exist: the model has layers 0..{n_layers - 1}"
            )
        return layers


@dataclass
class ProbeFitting(MethodConfig):
    """How each probe is fitted and checked: the options of the probe method and of
    :class:`ProbeConfig` alike.

    Attributes:
        test_fraction: share of texts held out for testing.
        folds: cross-validation folds (over training texts) to pick the regularisation.
        grid: inverse regularisation strengths tried: logistic ``C``; ridge uses
            ``alpha = 1 / C``. Larger is weaker.
        controls: which controls to fit, from ``within_type``, ``shuffled`` and ``control``
            (Hewitt & Liang), or ``none``; the ``selectivity_vs`` control is always fitted.
    """

    test_fraction: float = option(0.25, "share of texts held out", above=0, below=1)
    folds: int = option(3, "cross-validation folds (by text)", min=2)
    grid: list[float] = option(
        [1e-4, 1e-3, 1e-2, 1e-1, 1.0],
        "inverse regularisation strengths (logistic C; ridge alpha = 1/C)",
        above=0,
    )
    controls: list[str] = option(
        ["within_type", "shuffled"],
        "controls to fit: within_type, shuffled, control (Hewitt & Liang), or none; "
        "selectivity is always against the target's informative control (fitted anyway)",
    )


@dataclass
class ProbeConfig(ProbeFitting):
    """How probes are fitted (:class:`headhunt.probes.linear.Prober`): :class:`ProbeFitting`,
    and what the probe method derives from its target.

    Attributes:
        task: ``classification`` or ``regression``.
        max_iter: logistic regression iterations.
        selectivity_vs: the control ``selectivity`` is measured against: ``within_type``,
            ``shuffled``, ``control``, None (no selectivity) or ``auto``: within_type when
            types repeat (at most half of the rows are their type's only row), else shuffled,
            the rule by which each target names its informative one (``target.control``).
        seed: seed of the split and the control labels.
    """

    task: str = option("classification", "the probe's task", cli=False)
    max_iter: int = option(500, "logistic regression iterations", cli=False, min=1)
    selectivity_vs: str | None = option(
        "auto", "the control selectivity is measured against", type=str, cli=False
    )

    @property
    def score_name(self) -> str:
        return "accuracy" if self.task == "classification" else "r2"
