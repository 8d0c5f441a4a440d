"""The configs of circuit finding with discrete SAEs (O'Neill & Bui 2024): an SAE's training
(:class:`SAETraining`, the part of the library's ``SAEConfig`` the trials set), the SAE trials'
(:class:`CircuitConfig`, the library's) and the method's (:class:`CircuitsConfig`, the same
fields plus the prompt pairs, the patching ground truth and the circuit rule). Kept apart from
the analyzer so that the CLI's ``--help`` reads them without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from headhunt.config import MethodConfig, default_of, fields_of, option
from headhunt.errors import HeadhuntError

HEAD_NORMS = ("none", "center", "standardize")
# node_rule (also the SAETrial attribute holding that score) -> its AUC / scores.parquet key
NODE_RULES = {
    "changed": "sae_changed",
    "node": "sae_node",
    "node_norm": "sae_node_norm",
    "pos_only": "sae_pos_only",
}


@dataclass
class SAETraining(MethodConfig):
    """A discrete SAE's training hyperparameters (defaults: the paper's), declared once for the
    library's :class:`~headhunt.sae.discrete.SAEConfig` and the circuit trials'
    :class:`CircuitConfig`.

    Attributes:
        dict_size: number of features, i.e. of possible codes (at least 2: one feature would
            give every input the same code).
        l1: sparsity coefficient (the paper used 0.02; 0.05 for docstring).
        lr: Adam learning rate.
        epochs: full-batch steps.
    """

    dict_size: int = option(200, "SAE features", min=2)
    l1: float = option(0.02, "sparsity coefficient (the paper: 0.05 for docstring)")
    lr: float = option(1e-3, "SAE learning rate")
    epochs: int = option(500, "SAE training epochs", min=1)

    def validate(self) -> None:
        if self.lr <= 0:
            raise HeadhuntError(f"--lr must be positive, got {self.lr}")
        if self.l1 < 0:
            raise HeadhuntError(f"--l1 must not be negative, got {self.l1}")
        super().validate()


@dataclass
class CircuitConfig(SAETraining):
    """The SAE trials of a circuit-finding run (the library's config; the method's
    :class:`CircuitsConfig` adds the prompt pairs, the ground truth and the circuit rule).

    Defaults: those that ranked heads best on average over IOI, greater-than and docstring on
    SmolLM2-135M, chosen on one set of prompt pairs and checked on another (docs/circuits.md);
    the paper's are ``sae_examples=10, position="mean", head_norm="none", dict_size=200,
    node_rule="node"``.

    Attributes:
        trials: independent SAE runs (seeds ``seed``, ``seed + 1``, ...).
        sae_examples: prompts (positives and negatives mixed) each SAE is trained on; None:
            all of the trial's prompts.
        subsample: share of the pairs each trial scores on (1.0: all pairs every trial, so
            only the SAE's training draw and initialisation vary).
        position: head outputs averaged over positions ("mean", the paper's) or at the "last"
            position, where the answer is predicted.
        head_norm: what each head's outputs go through before the SAE: "none" (the paper's),
            "center" (minus the head's mean over the trial's prompts) or "standardize" (centred,
            then divided by the head's mean centred norm). Centring makes the SAE model how a
            head's output varies across prompts instead of which head wrote it; scaling stops
            the largest heads from owning the reconstruction loss. Labels are never used.
        dict_size, l1, lr, epochs: the SAE's (see :class:`SAETraining`).
        node_rule: the node score a run ranks heads by and reports as its SAE method, one of
            :data:`NODE_RULES` (see :class:`~headhunt.sae.scoring.NodeScores`): "changed"
            (share of pairs whose code differs between positive and negative), "node" (the
            paper's |P \\ N|), "node_norm", "pos_only". Every rule is scored in every run.
        edge_top_fraction: share of head pairs counted for the edge-derived head score.
        truth_share / truth_top: how patching effects are binarised (see
            :func:`headhunt.sae.roc.binarize_truth`); set one.
        seed: first trial's seed.
    """

    trials: int = option(10, "SAE runs, one seed each", limit=10_000)
    sae_examples: int | None = option(
        None, "prompts each SAE trains on (default: all of a trial's)", type=int
    )
    subsample: float = option(0.5, "share of the pairs each trial scores on")
    position: str = option("last", "where a head's output is read", choices=("mean", "last"))
    head_norm: str = option(
        "center",
        "per-head preprocessing before the SAE: none (the paper's), center (minus the head's "
        "mean), or standardize (centre, then scale each head to unit mean norm)",
        choices=HEAD_NORMS,
    )
    dict_size: int = default_of(SAETraining, "dict_size", 800)
    node_rule: str = option("changed", "the node score heads are ranked by", cli=False)
    edge_top_fraction: float = option(0.5, "share of code pairs kept for the edge scores")
    truth_share: float | None = option(
        0.5,
        "truth = fewest heads whose |patching effect| adds up to this share of the total",
        type=float,
    )
    truth_top: int | None = option(
        None, "truth = this many heads by |effect| instead", type=int, min=1
    )

    def validate(self) -> None:
        if not 0 < self.edge_top_fraction <= 1:
            raise HeadhuntError(
                f"--edge-top-fraction must be in (0, 1], got {self.edge_top_fraction}"
            )
        if self.truth_share is not None and not 0 < self.truth_share <= 1:
            raise HeadhuntError(f"--truth-share must be in (0, 1], got {self.truth_share}")
        if self.trials is not None and self.trials < 1:  # None: the method's device default
            raise HeadhuntError(f"need at least one trial, got {self.trials}")
        if self.sae_examples is not None and self.sae_examples < 1:
            raise HeadhuntError(f"need at least one SAE training example, got {self.sae_examples}")
        if not 0 < self.subsample <= 1:
            raise HeadhuntError(f"subsample must be in (0, 1], got {self.subsample}")
        if self.node_rule not in NODE_RULES:
            raise HeadhuntError(
                f"unknown node_rule {self.node_rule!r} (use {', '.join(NODE_RULES)})"
            )
        self.check_truth_rule()
        super().validate()

    def check_truth_rule(self) -> None:
        if (self.truth_share is None) == (self.truth_top is None):
            raise HeadhuntError("set exactly one of truth_share and truth_top")

    def truth_rule(self) -> dict[str, float | int | None]:
        """``share`` and ``top`` of :func:`headhunt.sae.roc.binarize_truth` (one is None)."""
        if self.truth_top is not None:
            return {"share": None, "top": self.truth_top}
        return {"share": self.truth_share, "top": None}

    def sae_config(self, d_in: int, seed: int):
        """The SAE of one trial (:class:`headhunt.sae.discrete.SAEConfig`)."""
        from headhunt.sae.discrete import SAEConfig

        return SAEConfig(d_in=d_in, **{**fields_of(self, SAETraining), "seed": seed})


# The defaults sized to the device (pairs, trials, dict_size): the full setting on a GPU; on a
# CPU one that finishes in minutes with the held-out IOI AUC of the full one (docs/circuits.md,
# "Defaults sized to the device": 0.840 +- 0.011 against 0.844 +- 0.006, 10 trials each).
DEVICE_DEFAULTS = {
    "cuda": {"pairs": 32, "trials": 10, "dict_size": 800},
    "cpu": {"pairs": 16, "trials": 3, "dict_size": 400},
}


def _by_device(name: str) -> str:
    gpu, cpu = DEVICE_DEFAULTS["cuda"][name], DEVICE_DEFAULTS["cpu"][name]
    return f"(default: {gpu} on a GPU, {cpu} on a CPU)"


@dataclass
class CircuitsConfig(CircuitConfig):
    """A circuits run: the task's prompt pairs, the SAE trials, the patching ground truth and
    EAP they are checked against, and the circuit rule. ``--truth-top`` replaces the
    ``--truth-share`` rule (the library's config takes exactly one).

    ``pairs``, ``trials`` and ``dict_size`` left None are sized to the device the run computes
    on (:data:`DEVICE_DEFAULTS`, :meth:`for_device`); the run's parameters record the values
    used."""

    trials: int | None = default_of(
        CircuitConfig, "trials", None, help=f"SAE runs, one seed each {_by_device('trials')}",
        type=int,
    )  # fmt: skip
    dict_size: int | None = default_of(
        CircuitConfig, "dict_size", None, help=f"SAE features {_by_device('dict_size')}", type=int
    )

    task: str = option(
        "ioi",
        "task generated for the model's tokenizer",
        choices=("ioi", "greater-than", "docstring"),
    )
    task_file: str | None = option(
        None, "your own prompt pairs (JSONL); overrides --task", type=str
    )
    pairs: int | None = option(
        None,
        f"prompt pairs generated for a task {_by_device('pairs')}",
        type=int,
        min=2,
        limit=1_000_000,
    )
    truth: bool = option(True, "skip activation patching", flag="--no-truth")
    eap: bool = option(True, "skip attribution patching", flag="--no-eap")
    truth_from: str | None = option(
        None,
        "reuse the patching ground truth and EAP of a finished run on the same model and "
        "prompt pairs (e.g. to compare SAE settings without patching again)",
        type=str,
    )
    circuit_size: int | None = option(
        None, "circuit = this many heads by node score", type=int, min=1
    )
    circuit_threshold: float | None = option(
        None,
        "circuit = heads whose node-rule score (default: share of pairs whose code changes) "
        "is above",
        type=float,
    )
    batch_size: int = option(8, "prompt pairs per forward pass", min=1)
    png: bool = option(True, "plots as HTML only (PNG needs kaleido)", flag="--no-png")
    progress: bool = option(True, "no progress bars", flag="--no-progress")

    def for_device(self, device: str) -> CircuitsConfig:
        """This config with the fields left None set to ``device``'s defaults ("cpu";
        "cuda" and any other accelerator get the GPU's)."""
        sized = DEVICE_DEFAULTS["cpu" if device == "cpu" else "cuda"]
        return replace(self, **{k: v for k, v in sized.items() if getattr(self, k) is None})

    def check(self) -> None:
        if self.circuit_size is not None and self.circuit_threshold is not None:
            raise HeadhuntError("give --circuit-size or --circuit-threshold, not both")

    def check_truth_rule(self) -> None:
        if self.truth_share is None and self.truth_top is None:
            raise HeadhuntError("give --truth-share or --truth-top")
