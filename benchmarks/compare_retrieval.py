"""Compare `headhunt retrieval` run directories trial by trial (the same grid run in different
ways: one GPU, two GPUs, again, deterministic kernels).

    python benchmarks/compare_retrieval.py BASE OTHER [OTHER ...] > compare.json

For each OTHER against BASE: identical files, trials whose score matrix / response / counted
flag differ, the largest score difference, the retrieval heads of each, and trials/s.
"""

from __future__ import annotations

import filecmp
import json
import sys
from pathlib import Path

import numpy as np


def load(path: Path) -> tuple[dict, dict]:
    trials = {}
    for line in (path / "trials.jsonl").read_text().splitlines():
        r = json.loads(line)
        trials[r["id"]] = r
    return trials, json.loads((path / "manifest.json").read_text())


def compare(base: Path, other: Path) -> dict:
    a, ma = load(base)
    b, mb = load(other)
    assert a.keys() == b.keys(), "different trials"
    scores = [i for i in a if a[i]["scores"] != b[i]["scores"]]
    diff = max(
        (float(np.abs(np.subtract(a[i]["scores"], b[i]["scores"])).max()) for i in scores),
        default=0.0,
    )
    return {
        "base": base.name,
        "other": other.name,
        "identical_files": {
            f: filecmp.cmp(base / f, other / f, shallow=False)
            for f in ("trials.jsonl", "retrieval_heads.json", "duo_attention.tsv", "scores.parquet")
        },
        "trials": len(a),
        "scores_differ": len(scores),
        "max_score_diff": diff,
        "responses_differ": sum(a[i]["response"] != b[i]["response"] for i in a),
        "counted_differ": sum(a[i]["counted"] != b[i]["counted"] for i in a),
        "differing_lengths": sorted({a[i]["length"] for i in scores}),
        "summary": (ma.get("summary"), mb.get("summary")),
        "trials_s": (ma["timings"]["trials_s"], mb["timings"]["trials_s"]),
        "processes": (ma.get("processes"), mb.get("processes")),
        "speed_up": ma["timings"]["trials_s"] / mb["timings"]["trials_s"],
    }


def main() -> None:
    base, *others = (Path(p) for p in sys.argv[1:])
    out = []
    if (base / "manifest.json").is_file():
        out = [compare(base, o) for o in others if (o / "manifest.json").is_file()]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
