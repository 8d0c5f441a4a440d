"""Which smaller SAE setting keeps the full setting's held-out AUC (docs/circuits.md, "Defaults
sized to the device"): IOI on the held-out split (32 pairs, seed 1; truth = binarised |mean EAP|,
as circuits_sweep.py), 10 trials per setting, headhunt's own run_trial. ``subsample`` 0.25 of 32
pairs is 8 pairs per trial, what the CPU default (16 pairs, subsample 0.5) trains and scores on.

    python benchmarks/circuits_sweep.py prepare --runs ioi:1:32 --out acts
    python benchmarks/circuits_device_defaults.py acts result.json
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import circuits_sweep as S
import torch

dev = "cuda" if torch.cuda.is_available() else "cpu"
data = S.load(Path(sys.argv[1]), "s1", dev)
base = {
    "dict_size": 800,
    "sae_examples": None,
    "position": "last",
    "head_norm": "center",
    "subsample": 0.5,
    "l1": 0.02,
    "epochs": 500,
}
cands = {
    "full": {},
    "d200_sub025": {"dict_size": 200, "subsample": 0.25},
    "d800_sub025": {"subsample": 0.25},
    "d200_sub05": {"dict_size": 200},
    "d200_sub025_e200": {"dict_size": 200, "subsample": 0.25, "epochs": 200},
    "d800_sub025_e100": {"subsample": 0.25, "epochs": 100},
    "d400_sub025": {"dict_size": 400, "subsample": 0.25},
}
res = {"device": S._device_name(dev), "trials": 10, "runs": {}}
for name, over in cands.items():
    cfg = {**base, **over}
    t0 = time.perf_counter()
    r = S.run_config(data, cfg, 10, edges=False)
    res["runs"][name] = {"config": cfg, "auc": r, "wall_s": time.perf_counter() - t0}
    print(name, json.dumps({k: v for k, v in r["ioi"].items()}), flush=True)
Path(sys.argv[2]).write_text(json.dumps(res, indent=1))
