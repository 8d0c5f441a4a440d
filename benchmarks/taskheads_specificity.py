"""Re-measure a finished taskheads run's specificity control on the bundled closed-book
prompts as they are now, without redoing the task side of the run.

The run's own ablations (each condition's heads and mode, read from its conditions file) are
applied to the closed-book prompts the full model answers, with the closed-book reference mean,
exactly as the method does (``TaskHeads.run_conditions``); the task accuracies are the run's.
The result is the run's ablation table with its specificity columns replaced (its
task-mean ``closed_book`` columns are dropped: they belonged to the old prompts). Runs made
before the control had 284 prompts can so be checked on a CPU; the dtype is said in the output
(a GPU run in bfloat16 checked in float32 keeps a slightly different set of prompts).

    python benchmarks/taskheads_specificity.py RUN_DIR --model smollm2-135m \
        --modes mean --out OUT.csv
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path


def conditions(run: Path) -> list[dict]:
    """The run's condition records (conditions.jsonl, gzipped or not)."""
    for name, opener in (("conditions.jsonl.gz", gzip.open), ("conditions.jsonl", open)):
        if (run / name).exists():
            with opener(run / name, "rt") as f:
                return [json.loads(line) for line in f if line.strip()]
    raise SystemExit(f"error: {run} has no conditions.jsonl[.gz]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a taskheads run directory")
    ap.add_argument("--model", required=True, help="the run's model (a headhunt model spec)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--modes", default=None, help="only these modes (comma separated)")
    ap.add_argument(
        "--top-only",
        action="store_true",
        help="only the detectors' top k (the random sets' columns left empty)",
    )
    ap.add_argument("--out", type=Path, required=True, help="the new ablation table (CSV)")
    args = ap.parse_args()

    from headhunt.errors import HeadhuntError
    from headhunt.heads.evaluations.task_ablation import (
        ablation,
        answers_right,
        closed_book_control,
    )
    from headhunt.heads.inputs.task_inputs import CLOSED_BOOK
    from headhunt.methods.taskheads import CLOSED_BOOK_BATCH, TaskHeadsConfig, ablation_table
    from headhunt.probes.hooked import load_model

    if not (args.run / "parameters.json").is_file():
        raise SystemExit(f"error: {args.run} is not a taskheads run (no parameters.json)")
    config = TaskHeadsConfig.from_dict(json.loads((args.run / "parameters.json").read_text()))
    if args.modes:
        config.modes = [m for m in config.modes if m in args.modes.split(",")]
    records = [c for c in conditions(args.run) if c["name"] == "none" or c["mode"] in config.modes]

    try:
        model = load_model(args.model, device="cpu", dtype=args.dtype)
    except HeadhuntError as e:
        raise SystemExit(f"error: {e}") from None
    kept, rows, means = closed_book_control(model, CLOSED_BOOK_BATCH)
    print(f"{args.model} {args.dtype}: {len(kept)} of {len(CLOSED_BOOK)} closed-book prompts kept; "
          f"{len(records)} conditions", flush=True)  # fmt: skip

    t0 = time.perf_counter()
    for i, c in enumerate(records):
        if args.top_only and c["name"].startswith(("random/", "outside/")):
            c["specificity"] = c["closed_book"] = []  # not measured: no old verdicts kept
            continue
        hooks = ablation(c["heads"], c["mode"], means)  # a zero ablation reads no mean
        c["specificity"] = answers_right(model, kept, hooks, CLOSED_BOOK_BATCH, rows)
        c["closed_book"] = c["specificity"]  # its columns are dropped; its length is counted
        if i % 50 == 49:
            print(f"{i + 1} of {len(records)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    table = ablation_table({c["name"]: c for c in records}, config, config.ks)
    table = table.drop(columns=["closed_book", "random_closed_book"])
    table["specificity_dtype"] = args.dtype
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    table.to_csv(tmp, index=False)
    tmp.rename(args.out)
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
