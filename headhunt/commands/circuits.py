"""`headhunt circuits`: circuit heads from discrete SAE codes, checked against patching."""

from __future__ import annotations

import argparse

from headhunt.commands.common import (
    add_command,
    add_model_args,
    add_out_args,
    finite_float,
    require,
)
from headhunt.errors import HeadhuntError

DESCRIPTION = """\
Find the heads of a task's circuit with discrete sparse autoencoders (O'Neill & Bui 2024): one
SAE over every head's output turns each head's output on a prompt into an integer code; a head
scores by the codes it takes on positive prompts and never on negative ones (node score), or by
the code pairs it forms with other heads (edge score).

Unless --no-truth, the same prompt pairs give the ground truth for this model: per-head
activation patching (clean into corrupted, effect on the logit difference), binarised by
--truth-share or --truth-top. Each method's ROC AUC against it is reported over --trials seeds,
with attribution patching (EAP) as the fast baseline, and every method's runtime.

Tasks: ioi, greater-than, docstring (generated for the model's tokenizer), or --task-file: JSON
lines {"positive": ..., "negative": ..., "answer": " Mary", "wrong": " John"} ("answer" and
"wrong" may be lists; both are needed for the ground truth and EAP, not for the SAE scores)."""


def add_parser(sub) -> None:
    p = add_command(sub, "circuits", "circuit heads from discrete SAE codes", DESCRIPTION)
    add_model_args(p)
    add_out_args(p, default="runs/circuits")
    g = p.add_argument_group("task")
    g.add_argument("--task", default="ioi", choices=["ioi", "greater-than", "docstring"])
    g.add_argument("--task-file", help="your own prompt pairs (JSONL); overrides --task")
    g.add_argument("--pairs", type=int, default=32, help="prompt pairs generated for a task")
    g = p.add_argument_group(
        "SAE (defaults: chosen on SmolLM2-135M, docs/circuits.md; the paper's: --sae-examples 10 "
        "--position mean --head-norm none --dict-size 200)"
    )
    g.add_argument("--trials", type=int, default=10, help="SAE runs, one seed each")
    g.add_argument(
        "--sae-examples",
        type=int,
        help="prompts each SAE trains on (default: %(default)s, all of a trial's)",
    )
    g.add_argument(
        "--subsample",
        type=finite_float,
        default=0.5,
        help="share of the pairs each trial scores on",
    )
    g.add_argument("--position", default="last", choices=["mean", "last"])
    g.add_argument(
        "--head-norm",
        default="center",
        choices=["none", "center", "standardize"],
        help="per-head preprocessing before the SAE: none (the paper's), center (minus the "
        "head's mean), or standardize (centre, then scale each head to unit mean norm)",
    )
    g.add_argument("--dict-size", type=int, default=800)
    g.add_argument(
        "--l1",
        type=finite_float,
        default=0.02,
        help="sparsity coefficient (the paper: 0.05 for docstring)",
    )
    g.add_argument("--lr", type=finite_float, default=1e-3)
    g.add_argument("--epochs", type=int, default=500)
    g.add_argument("--edge-top-fraction", type=finite_float, default=0.5)
    g = p.add_argument_group("ground truth and circuit")
    g.add_argument("--no-truth", action="store_true", help="skip activation patching")
    g.add_argument("--no-eap", action="store_true", help="skip attribution patching")
    g.add_argument(
        "--truth-from",
        metavar="RUN",
        help="reuse the patching ground truth and EAP of a finished run on the same model and "
        "prompt pairs (e.g. to compare SAE settings without patching again)",
    )
    g.add_argument(
        "--truth-share",
        type=finite_float,
        default=0.5,
        help="truth = fewest heads whose |patching effect| adds up to this share of the total",
    )
    g.add_argument("--truth-top", type=int, help="truth = this many heads by |effect| instead")
    g.add_argument("--circuit-size", type=int, help="circuit = this many heads by node score")
    g.add_argument(
        "--circuit-threshold",
        type=finite_float,
        help="circuit = heads whose node-rule score (default: share of pairs whose code "
        "changes) is above",
    )
    g.add_argument("--batch-size", type=int, default=8, help="prompt pairs per forward pass")
    g.add_argument("--top", type=int, default=15, help="heads printed")
    g.add_argument("--no-png", action="store_true", help="plots as HTML only (PNG needs kaleido)")
    g.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def _check_args(args: argparse.Namespace) -> None:
    require(args.pairs >= 2, f"--pairs must be at least 2, got {args.pairs}")
    require(args.batch_size >= 1, f"--batch-size must be at least 1, got {args.batch_size}")
    require(args.top >= 0, "--top must not be negative")
    require(
        args.circuit_size is None or args.circuit_threshold is None,
        "give --circuit-size or --circuit-threshold, not both",
    )
    require(args.dict_size >= 1, f"--dict-size must be at least 1, got {args.dict_size}")
    require(args.lr > 0, f"--lr must be positive, got {args.lr}")
    require(args.epochs >= 1, f"--epochs must be at least 1, got {args.epochs}")
    require(args.l1 is None or args.l1 >= 0, f"--l1 must not be negative, got {args.l1}")
    require(
        0 < args.edge_top_fraction <= 1,
        f"--edge-top-fraction must be in (0, 1], got {args.edge_top_fraction}",
    )
    require(0 < args.truth_share <= 1, f"--truth-share must be in (0, 1], got {args.truth_share}")
    require(
        args.truth_top is None or args.truth_top >= 1,
        f"--truth-top must be at least 1, got {args.truth_top}",
    )
    require(
        args.circuit_size is None or args.circuit_size >= 1,
        f"--circuit-size must be at least 1, got {args.circuit_size}",
    )
    if args.truth_from:  # a missing or unfinished run fails now, not after the model loads
        from headhunt.rundir import load_run

        done = load_run(args.truth_from)
        require(
            done.method == "circuits",
            f"--truth-from {args.truth_from} is a {done.method} run, not a circuits run",
        )
    if args.task_file:  # a missing, binary or malformed task file fails before the model loads
        from pathlib import Path

        from headhunt.sae.tasks import read_task_file

        path = Path(args.task_file).expanduser()
        require(path.is_file(), f"no task file at {path}")
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise HeadhuntError(f"--task-file {path} is not UTF-8 text (JSON lines)") from None
        except OSError as e:
            raise HeadhuntError(f"cannot read --task-file {path}: {e.strerror or e}") from None
        read_task_file(path)


def parameters(args: argparse.Namespace) -> dict:
    """What decides the numbers of a run (a resumed run must match them)."""
    from pathlib import Path

    return {
        "model": args.model,
        "dtype": args.dtype,
        "task": None if args.task_file else args.task,
        "task_file": str(Path(args.task_file).expanduser().resolve()) if args.task_file else None,
        "pairs": args.pairs,
        "trials": args.trials,
        "sae_examples": args.sae_examples,
        "subsample": args.subsample,
        "position": args.position,
        "head_norm": args.head_norm,
        "dict_size": args.dict_size,
        "l1": args.l1,
        "lr": args.lr,
        "epochs": args.epochs,
        "edge_top_fraction": args.edge_top_fraction,
        "truth": not args.no_truth,
        "eap": not args.no_eap,
        "truth_share": None if args.truth_top is not None else args.truth_share,
        "truth_top": args.truth_top,
        "seed": args.seed,
    }


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    params = parameters(args)
    from headhunt.sae.circuits import CircuitConfig

    config = CircuitConfig.from_dict(params)  # validates before anything heavy happens

    from headhunt.commands.common import open_model, print_table, seed_everything
    from headhunt.rundir import RunDir, load_run
    from headhunt.sae import report

    run_dir = RunDir.open(
        args.out, "circuits", resume=args.resume, force=args.force, parameters=params
    )
    if run_dir.complete:
        done = load_run(run_dir.out)
        report.print_summary(done.path, print_table, top=args.top)
        return 0
    seed_everything(args.seed)
    model = open_model(args)
    # A prompt longer than the context would fail only after minutes of capture and patching.
    pairs = report.load_pairs(model, params, args.task_file)
    longest = max(len(ids) for ids in [*pairs.positive, *pairs.negative])
    require(
        longest <= model.max_context,
        f"a prompt has {longest} tokens, more than the model's context ({model.max_context})",
    )
    path = report.run(
        model,
        run_dir,
        params,
        config,
        task_file=args.task_file,
        truth_from=args.truth_from,
        batch_size=args.batch_size,
        circuit_size=args.circuit_size,
        circuit_threshold=args.circuit_threshold,
        progress=not args.no_progress,
        png=not args.no_png,
    )
    report.print_summary(path, print_table, top=args.top)
    return 0
