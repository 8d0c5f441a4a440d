"""Redo ``benchmarks/zoology.py``'s analyses (recall heads, induction, masking, the graded
masking curve) on models it saved (``ZOOLOGY_SAVE``: float16 safetensors with their config),
on a GPU or a CPU, without retraining.

The test sets are regenerated from the seeds ``zoology.py`` uses (Zoology's generator,
``2 * 10**6 + pairs``), so an analysis here reads the same examples as the original run.

    python3 benchmarks/zoology_reanalyse.py OUT.json MODEL.safetensors [MODEL ...]
        [--pairs 16,64] [--examples 256]

OUT is rewritten after each (model, pair count); each entry also has the model's test accuracy
at those pair counts (1,000 examples), to compare with the run that trained it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import zoology  # noqa: E402 (the benchmark beside this file)


def load_saved(path: Path, device):
    """The model, its ``MQARTrainConfig`` and job of a file written by ``zoology.save_model``."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from headhunt.heads.mqar_train import MQARTrainConfig, build_model

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    cfg = MQARTrainConfig.from_dict(json.loads(meta["train"]))
    model = build_model(cfg)
    model.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    return model.to(device).eval(), cfg, json.loads(meta["job"])


def main() -> None:
    import torch

    from headhunt.heads.mqar_train import query_accuracy

    args = sys.argv[1:]
    pairs, examples = (16, 64), 256
    if "--pairs" in args:
        i = args.index("--pairs")
        pairs = tuple(int(p) for p in args.pop(i + 1).split(","))
        args.pop(i)
    if "--examples" in args:
        i = args.index("--examples")
        examples = int(args.pop(i + 1))
        args.pop(i)
    out_path, models = Path(args[0]), [Path(a) for a in args[1:]]
    torch.backends.cuda.matmul.allow_tf32 = True  # as the training run's analyses
    torch.backends.cudnn.allow_tf32 = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    test = {n: zoology._generate((n, zoology.TEST_EXAMPLES, 2 * 10**6 + n)) for n in pairs}
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "pairs": list(pairs),
        "examples": examples,
        "models": [],
    }
    for path in models:
        t0 = time.perf_counter()
        model, cfg, job = load_saved(path, device)
        entry = {"file": path.name, "job": job, "heads": {}}
        entry["accuracy"] = {str(n): query_accuracy(model, test[n]) for n in pairs}
        result["models"].append(entry)
        for n in pairs:
            entry["heads"][str(n)] = zoology.analyse(model, cfg, {"test": test}, n, examples)
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            zoology.write_json(out_path, result, indent=1)
        print(path.name, entry["accuracy"], entry["seconds"], flush=True)
    zoology.write_json(out_path, result, indent=1)


if __name__ == "__main__":
    main()
