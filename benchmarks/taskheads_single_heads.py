"""Every head ablated alone, after a taskheads run: is a random k-head set's loss the work of
one or two heads the detectors miss, or does the model lose accuracy to many single heads?

Reads a finished run directory (its parameters, its scoring examples' output sums for the mean,
its examples' records), rebuilds the same examples and runs the method's own causal check
(``Plan.run_conditions``: the same mean ablation, greedy exact match and closed-book control
with the closed-book mean) on one condition per head, ``single/MODE/LAYER-HEAD``. Writes
``singles.jsonl`` (the records of conditions.jsonl) into the run directory, or ``--out``.

    python benchmarks/taskheads_single_heads.py RUN_DIR --model MODEL [--batch-size 64] [--layers 4,5]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


class _Context:
    """The few RunContext calls ``Plan.run_conditions`` makes, onto one JSONL file."""

    def __init__(self, path: Path):
        self.path = path
        self.done_names = set()
        if path.is_file():
            self.done_names = {json.loads(line)["name"] for line in path.open()}

    def done(self, _name, key):
        return self.done_names

    def todo(self, items):
        return items

    def units(self, items, _what, done_before=0):
        t0 = time.perf_counter()
        for i, item in enumerate(items):
            yield item
            if (i + 1) % 12 == 0:
                print(f"{done_before + i + 1} conditions, {time.perf_counter() - t0:.0f} s",
                      flush=True)  # fmt: skip

    def append(self, _name, record):
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--model", required=True)
    from headhunt.heads.evaluations.task_modes import MODES

    ap.add_argument("--mode", default="mean", choices=tuple(MODES))
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--layers", default="", help="LAYER,...: only these layers' heads")
    args = ap.parse_args()

    from headhunt.heads.inputs.task_inputs import Encoder
    from headhunt.methods.base import read_jsonl
    from headhunt.methods.taskheads import EXAMPLES, Plan, TaskHeadsConfig
    from headhunt.probes.hooked import load_model

    params = json.loads((args.run / "parameters.json").read_text())
    config = TaskHeadsConfig.from_dict(params)
    if args.batch_size:
        config.batch_size = args.batch_size
    config.modes = [args.mode]  # (a run from before mean-readout is refused in one line)
    model = load_model(args.model)
    examples = config.load()
    encoder = Encoder(model.tokenizer, model.max_context)
    encoded = [encoder.encode(ex) for ex in examples]
    plan = Plan(model, config, list(read_jsonl(args.run / EXAMPLES)), encoded)
    plan.conditions = {"none": {"heads": [], "mode": "zero"}}
    layers = [int(x) for x in args.layers.split(",") if x] or range(model.n_layers)
    for layer in layers:
        for head in range(model.n_heads):
            plan.conditions[f"single/{args.mode}/{layer}-{head}"] = {
                "heads": [[layer, head]], "mode": args.mode,
            }  # fmt: skip
    out = args.out or args.run / "singles.jsonl"
    t0 = time.perf_counter()
    plan.run_conditions(_Context(out))
    print(f"{len(plan.conditions)} conditions in {time.perf_counter() - t0:.0f} s -> {out}")


if __name__ == "__main__":
    main()
