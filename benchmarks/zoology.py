"""Zoology (Arora et al., arXiv 2312.04927) on the project's own runs: MQAR accuracy of tiny
attention, attention-free and hybrid models built from installed transformers config classes,
trained to (near) convergence, then headhunt's recall-head, induction and masking analyses on the
trained models that have attention.

Models (2 layers each but hybrid2, 8 heads where there are heads):
- attention: LFM2 with two full-attention layers;
- hybrid: LFM2 with a gated short-convolution layer, then one attention layer (the layout of
  every two-layer model of Zoology's Based sweep: its ``Hybrid`` mixer gives layer i the
  mixer ``configs[i % len(configs)]`` of ``[conv, X]``, HazyResearch/zoology
  ``zoology/mixers/hybrid.py``);
- hybrid2: the same alternation over four layers, conv, attention, conv, attention: two
  attention layers (Zoology's ``Hybrid`` at ``n_layers=4``; twice the depth of the others);
- mamba2: two Mamba2 layers (attention-free state-space model, transformers' PyTorch path);
- gated conv: LFM2 with two gated short-convolution layers (attention-free; kernel 3, so two
  layers see 5 tokens: a floor, not Zoology's long convolutions).

Data and training follow the Based paper's MQAR sweep in Zoology's repository
(HazyResearch/zoology, ``zoology/experiments/paper_configs/arxiv24_based_figure2/configs.py``):
vocabulary 8192, one training set mixing 4 to 64 key-value pairs (20,000 examples per pair count,
here all at 256 tokens), batch 256, learning rates from their grid ``np.logspace(-3, -1.5, 4)``
(the lowest two here), 1,000 test examples per pair count. Deviations, for the time budget:
training stops at a wall-clock limit or once a validation set is solved, with linear warm-up
and a cosine decay over that wall-clock budget; transformers' blocks keep their MLPs.

Every (model, width, learning rate) trains in its own process, all at once on the one GPU
(small models are launch-bound: one process alone leaves the GPU mostly idle). For each
(model, width) the learning rate with the best validation accuracy (a set apart from the test
set) is reported, as Zoology reports the best of its sweep.

Run on the GPU machine: python3 benchmarks/zoology.py OUT.json [--seconds S] [--deadline D]
[--smoke] [--only attention,hybrid] [--widths 64,128] [--lrs 0.001] [--seed 0,1] [--heads 8,16]
(S: training seconds per model; D: the whole script's limit, after which running workers are
killed; --only / --widths: a comma-separated subset of the models / widths, to split the sweep
over calls; --lrs: these learning rates for every model chosen, in place of the defaults;
--seed: initialisation and batch order, one run per seed; --heads: attention heads per layer,
one run per count, head size = width / heads). With ZOOLOGY_SAVE=DIR set, each trained model is
rounded to float16 and written to DIR before it is evaluated and analysed (every number of that
run is then of the saved weights; ``accuracy_float32`` keeps the test accuracy before rounding).
OUT is rewritten
whenever a run finishes or a worker validates (every 250 steps: a run killed at the deadline
keeps its curve; the report: benchmarks/zoology_report.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB, SEQ = 8192, 256
TRAIN_PAIRS = (4, 8, 16, 32, 64)
TRAIN_EACH = 20_000
TEST_PAIRS = (4, 16, 64)
TEST_EXAMPLES = 1000
VAL_EXAMPLES = 256
HEADS = 8
BATCH = 256
WARMUP_STEPS = 100
EVAL_EVERY = 250  # steps between validations (the only host synchronisations)
SOLVED = 0.995  # validation accuracy at every test pair count that stops training
CURVE_SETS = 20  # random sets of k heads per k in the graded masking (all of them where fewer)
ARCHS = {
    "attention": ("lfm2", ("full_attention", "full_attention")),
    "hybrid": ("lfm2", ("conv", "full_attention")),
    "hybrid2": ("lfm2", ("conv", "full_attention", "conv", "full_attention")),
    "mamba2": ("mamba2", None),
    "gated conv": ("lfm2", ("conv", "conv")),
}
WITH_ATTENTION = ("attention", "hybrid", "hybrid2")  # the models headhunt's analyses run on
WIDTHS = (64, 128)
LRS = (1e-3, 3.2e-3)  # the two lowest of logspace(-3, -1.5, 4)


def jobs(
    smoke: bool,
    widths: tuple[int, ...] = WIDTHS,
    lrs: tuple[float, ...] | None = None,
    seeds: tuple[int, ...] = (0,),
    heads: tuple[int, ...] = (HEADS,),
) -> list[dict]:
    if smoke:
        smoke_job = {"lr": 3.2e-3, "batch": 8, "probe": 16, "eval_every": 2}
        return [
            {"arch": a, "width": w, **smoke_job, **({"lr": lr} if lrs else {}), "seed": seed}
            | {"n_heads": h}
            for a in ARCHS
            for w in widths[:1]
            for lr in (lrs or (None,))
            for seed in seeds
            for h in heads
        ]
    out = []
    for arch in ARCHS:
        for width in widths:
            # The short convolutions cannot see past 5 tokens: one rate is enough to show it.
            # Mamba2 (transformers' PyTorch scan) keeps the GPU busy while the others are
            # launch-bound: one rate each, so it does not starve the other processes.
            default = LRS[1:] if arch in ("gated conv", "mamba2") else LRS
            for lr in lrs or default:
                for h in heads if arch != "mamba2" else (HEADS,):  # Mamba2's heads are its own
                    for seed in seeds:
                        job = {"arch": arch, "width": width, "lr": lr, "batch": BATCH}
                        job |= {"probe": 256, "eval_every": EVAL_EVERY, "seed": seed, "n_heads": h}
                        out.append(job)
    return out


def _generate(args: tuple[int, int, int]):
    from headhunt.heads.inputs.mqar_inputs import MQARSpec, generate_mqar

    n_pairs, n, seed = args
    return generate_mqar(MQARSpec(vocab_size=VOCAB, seq_len=SEQ, n_pairs=n_pairs), n, seed=seed)


def make_data(path: Path, smoke: bool) -> float:
    """Training pool, validation and test sets (Zoology's generator; disjoint seeds)."""
    import multiprocessing as mp

    import torch

    from headhunt.heads.mqar_train import mqar_pool

    t0 = time.perf_counter()
    each = 512 if smoke else TRAIN_EACH
    chunks = 8 if not smoke else 1  # examples per pair count, generated in parallel chunks
    work = [(n, each // chunks, 1000 * n + c) for n in TRAIN_PAIRS for c in range(chunks)]
    n_val, n_test = (32, 64) if smoke else (VAL_EXAMPLES, TEST_EXAMPLES)  # smoke: a CPU check
    work += [(n, n_val, 10**6 + n) for n in TEST_PAIRS]
    work += [(n, n_test, 2 * 10**6 + n) for n in TEST_PAIRS]
    with mp.get_context("spawn").Pool(min(len(work), os.cpu_count() or 1)) as pool:
        done = pool.map(_generate, work)
    n_train = len(TRAIN_PAIRS) * chunks
    train = mqar_pool(done[:n_train])
    val = dict(zip(TEST_PAIRS, done[n_train : n_train + len(TEST_PAIRS)], strict=True))
    test = dict(zip(TEST_PAIRS, done[n_train + len(TEST_PAIRS) :], strict=True))
    torch.save({"train": train, "val": val, "test": test}, path)
    return time.perf_counter() - t0


def train(job: dict, data: dict, seconds: float, dev, on_validation=None) -> tuple:
    """Train one model for ``seconds``; ``on_validation(log)`` is called after each validation
    (the worker writes the curve so far, so a run killed at the deadline keeps it)."""
    import torch

    from headhunt.heads.mqar_train import MQARTrainConfig, build_model, query_accuracy, query_loss

    family, layers = ARCHS[job["arch"]]
    cfg = MQARTrainConfig(
        vocab_size=VOCAB,
        seq_len=SEQ,
        d_model=job["width"],
        n_layers=len(layers) if layers else 2,
        n_heads=job.get("n_heads", HEADS),
        family=family,
        layer_types=layers,
        lr=job["lr"],
        batch_size=job["batch"],
        seed=job.get("seed", 0),
    )
    model = build_model(cfg).to(dev)
    model.train()
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=0.1, fused=dev.type == "cuda"
    )
    pool = data["train"].to(dev)
    gen = torch.Generator(device=dev).manual_seed(job.get("seed", 0))
    log: dict = {"step": [], "seconds": [], "loss": [], "val_curve": []}
    t0 = time.perf_counter()
    step = 0
    while True:
        frac = (time.perf_counter() - t0) / seconds
        if frac >= 1:
            break
        warm = min(1.0, (step + 1) / WARMUP_STEPS)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * warm * 0.5 * (1 + math.cos(math.pi * frac))
        index = torch.randint(len(pool), (cfg.batch_size,), device=dev, generator=gen)
        loss = query_loss(model, *pool.batch(index))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % job["eval_every"] == 0:
            model.eval()
            val = {n: query_accuracy(model, data["val"][n]) for n in TEST_PAIRS}
            model.train()
            log["step"].append(step)
            log["seconds"].append(round(time.perf_counter() - t0, 1))
            log["loss"].append(round(loss.item(), 4))
            log["val_curve"].append([round(v, 4) for v in val.values()])
            if on_validation is not None:
                on_validation(log)
            if min(val.values()) >= SOLVED:
                break
    model.eval()
    log.update(steps=step, train_s=round(time.perf_counter() - t0, 1))
    return model, cfg, log


def curve_ks(n_heads: int) -> list[int]:
    """The graded masking's k: 1 to 8 heads, then a few more up to every attention head."""
    return sorted(
        {*range(1, min(8, n_heads) + 1), *(k for k in (12, 16, 24) if k < n_heads)} | {n_heads}
    )


def analyse(model, cfg, data: dict, pairs: int, examples: int, n_random: int = 10) -> dict:
    """headhunt on a trained model with attention layers: recall heads (query -> value
    attention), their induction scores, and masking the top 1 / 2 heads against ``n_random``
    sets of as many other attention heads, and every attention head at once; then the graded
    curve (``masking_curve``): the top k by query -> value against ``CURVE_SETS`` random sets
    of k heads drawn from every attention head, k = ``curve_ks``."""
    import numpy as np
    import torch

    from headhunt.heads.mqar import masking_check, masking_curve, score_recall_heads
    from headhunt.heads.mqar_train import mqar_tokenizer
    from headhunt.heads.ngram import NgramConfig, score_sequences
    from headhunt.probes.hooked import HookedModel

    hm = HookedModel(model=model, tokenizer=mqar_tokenizer(VOCAB), name=f"zoology-{cfg.family}")
    probe = data["test"][pairs].slice(slice(0, examples))
    scores, base = score_recall_heads(hm, probe, batch_size=64)
    q2v = scores.matrix("query_to_value")
    n_attention = len(hm.attention_layers) * hm.n_heads
    top = scores.top("query_to_value", n_attention)
    ranked = [(int(r.layer), int(r.head)) for r in top.itertuples()]
    g = torch.Generator().manual_seed(0)
    half = torch.randint(1, VOCAB, (32, 64), generator=g)
    recs = score_sequences(
        hm, list(torch.cat([half, half], 1)), NgramConfig(exclude_bos=False), batch_size=32
    )
    induction = np.nanmean(np.stack([r.tl_ind for r in recs]), 0)

    def nan_free(a):
        return np.where(np.isnan(a), None, np.round(a, 4)).tolist()

    masks = {}
    for k in (1, 2):
        check = masking_check(hm, probe, ranked[:k], n_random=n_random, batch_size=64, seed=k)
        masks[str(k)] = {
            key: check[key] for key in ("heads", "masked", "random", "random_mean", "random_sets")
        }
    every = [(la, h) for la in hm.attention_layers for h in range(hm.n_heads)]
    all_masked = masking_check(hm, probe, every, n_random=0, batch_size=64)["masked"]
    ks = curve_ks(n_attention)
    curve = masking_curve(hm, probe, ranked, ks, n_random=CURVE_SETS, batch_size=64, seed=pairs)
    return {
        "attention_layers": hm.attention_layers,
        "layer_kinds": hm.layer_kinds,
        "pairs": pairs,
        "examples": len(probe),
        "queries": int(probe.query_pos.numel()),
        "baseline": base.accuracy,
        "query_to_value": nan_free(q2v),
        "induction": nan_free(induction),
        "ranked": ranked,
        "masking": masks,
        "all_attention_masked": all_masked,
        "curve": curve,
    }


def worker(job: dict, data_path: str, out_path: str, seconds: float) -> None:
    import torch

    from headhunt.heads.mqar_train import query_accuracy

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.load(data_path, weights_only=False)
    run = dict(job)
    try:

        def partial(log: dict) -> None:
            write_json(out_path, {**run, **log, "training": True})

        model, cfg, log = train(job, data, seconds, dev, on_validation=partial)
        run.update(log)
        run["params"] = sum(p.numel() for p in model.parameters())
        save_dir = os.environ.get("ZOOLOGY_SAVE")
        if save_dir:  # every number below is then of the saved (float16-rounded) weights
            run["accuracy_float32"] = {
                str(n): query_accuracy(model, data["test"][n]) for n in TEST_PAIRS
            }
            run["saved"] = save_model(model, cfg, run, Path(save_dir))
        run["val"] = {str(n): query_accuracy(model, data["val"][n]) for n in TEST_PAIRS}
        run["accuracy"] = {str(n): query_accuracy(model, data["test"][n]) for n in TEST_PAIRS}
        write_json(out_path, run)  # keep the accuracy if an analysis fails
        if job["arch"] in WITH_ATTENTION:
            run["heads"] = {}
            for pairs in (16, 64):
                try:
                    run["heads"][str(pairs)] = analyse(model, cfg, data, pairs, job["probe"])
                except Exception as e:  # keep the sweep's numbers if an analysis fails
                    run["heads_error"] = f"{type(e).__name__}: {e}"[:400]
                write_json(out_path, run)
    except Exception as e:
        run["error"] = f"{type(e).__name__}: {e}"[:400]
    write_json(out_path, run)
    print(summary(run))


def model_name(job: dict) -> str:
    arch = job["arch"].replace(" ", "_")
    return f"{arch}_w{job['width']}_h{job.get('n_heads', HEADS)}_lr{job['lr']:g}_s{job['seed']}"


def save_model(model, cfg, run: dict, folder: Path) -> str:
    """Round the trained weights to float16 in place (half the bytes: the device returns files
    of at most 16 MiB) and write them, with the training config in the file's metadata
    (``headhunt.heads.mqar_train.MQARTrainConfig``), as ``folder/<name>.safetensors``. The
    caller measures everything after this on the rounded model, so the file reproduces it."""
    import torch
    from safetensors.torch import save_file

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{model_name(run)}.safetensors"
    state = {k: v.detach().half().cpu().contiguous() for k, v in model.state_dict().items()}
    job = {k: run[k] for k in ("arch", "width", "n_heads", "lr", "seed", "steps") if k in run}
    meta = {"train": json.dumps(cfg.to_dict()), "job": json.dumps(job)}
    save_file(state, str(path), metadata=meta)
    return path.name


def write_json(path: str | Path, obj: dict, indent: int | None = None) -> None:
    """Write whole or not at all (the main process reads these files while workers run)."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(obj, indent=indent))
    os.replace(tmp, path)


def summary(run: dict) -> str:
    """One line of a run for the log: its numbers without the curves and analyses."""
    curves = ("heads", "loss", "val_curve", "step", "seconds")
    return json.dumps({k: v for k, v in run.items() if k not in curves})


def best_runs(runs: list[dict]) -> list[dict]:
    """Per (arch, width, heads, seed): the learning rate with the best mean validation
    accuracy."""
    best: dict[tuple, dict] = {}
    for r in runs:
        if "val" not in r or not isinstance(r["val"], dict):
            continue
        key = (r["arch"], r["width"], r.get("n_heads", HEADS), r.get("seed", 0))
        score = sum(r["val"].values()) / len(r["val"])
        if key not in best or score > best[key]["_score"]:
            best[key] = {**r, "_score": score}
    return [{k: v for k, v in r.items() if k != "_score"} for r in best.values()]


def main() -> None:
    import torch

    out_path = Path(sys.argv[1])
    smoke = "--smoke" in sys.argv
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 240
    # The whole script's limit (data, start-up, training, evaluation, analyses): workers still
    # running then are killed and OUT keeps what they wrote.
    if "--deadline" in sys.argv:
        deadline = float(sys.argv[sys.argv.index("--deadline") + 1])
    else:
        deadline = seconds + (600 if smoke else 180)
    # A folder of its own unless ZOOLOGY_TMP names one: the workers' records are run0.json,
    # run1.json, ..., so two invocations sharing a folder overwrite each other's (calls 12-14).
    own = not os.environ.get("ZOOLOGY_TMP")
    work = Path(os.environ.get("ZOOLOGY_TMP") or tempfile.mkdtemp(prefix="zoology-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data_s = make_data(work / "data.pt", smoke)
    import transformers

    result = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "data_s": round(data_s, 1),
        "vocab": VOCAB,
        "seq_len": SEQ,
        "train_pairs": TRAIN_PAIRS,
        "train_examples_per_pairs": 512 if smoke else TRAIN_EACH,
        "test_examples": TEST_EXAMPLES,
        "val_examples": VAL_EXAMPLES,
        "batch": BATCH,
        "heads": HEADS,
        "train_seconds": seconds,
        "solved_at": SOLVED,
        "runs": [],
    }
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    widths = WIDTHS
    if "--widths" in sys.argv:
        widths = tuple(int(w) for w in sys.argv[sys.argv.index("--widths") + 1].split(","))
    lrs = None
    if "--lrs" in sys.argv:
        lrs = tuple(float(x) for x in sys.argv[sys.argv.index("--lrs") + 1].split(","))
    seeds = (0,)
    if "--seed" in sys.argv:
        seeds = tuple(int(x) for x in sys.argv[sys.argv.index("--seed") + 1].split(","))
    heads = (HEADS,)
    if "--heads" in sys.argv:
        heads = tuple(int(x) for x in sys.argv[sys.argv.index("--heads") + 1].split(","))
    result["heads"] = list(heads)  # attention heads per layer, one run per count
    todo = jobs(smoke, widths, lrs, seeds, heads)
    todo = [j for j in todo if only is None or j["arch"] in only]
    procs = []
    for i, job in enumerate(todo):
        out = work / f"run{i}.json"
        out.unlink(missing_ok=True)
        log = open(work / f"run{i}.log", "w")  # noqa: SIM115 (closed after the wait)
        cmd = [sys.executable, __file__, "--worker", json.dumps(job), str(work / "data.pt")]
        cmd += [str(out), str(seconds)]
        procs.append((job, out, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    # Rewrite OUT whenever a run finishes, so a call killed at its limit keeps what finished.
    write_result(out_path, result, procs, t0)
    finished, written = 0, time.perf_counter()
    while any(proc.poll() is None for _, _, proc, _ in procs):
        if time.perf_counter() - t0 > deadline:
            for _, _, proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            break
        time.sleep(2)
        now = sum(proc.poll() is not None for _, _, proc, _ in procs)
        # Also every 30 s: the curves so far survive a call killed before the deadline.
        if now != finished or time.perf_counter() - written > 30:
            finished, written = now, time.perf_counter()
            write_result(out_path, result, procs, t0)
    for _, _, _, log in procs:
        log.close()
    result = write_result(out_path, result, procs, t0)
    for run in result["runs"]:
        print(summary(run))
    if own:  # the workers' records are in OUT now (a failed run with its log's tail)
        shutil.rmtree(work, ignore_errors=True)


def collect(job: dict, out: Path, proc: subprocess.Popen, log) -> dict:
    """A worker's result so far: its file (accuracy first, analyses when done) and, for a run
    that failed or was killed at the deadline, why and the end of its log."""
    run = json.loads(out.read_text()) if out.exists() else {**job}
    if proc.poll() is None:
        run["running"] = True
        return run
    if not out.exists():
        run["error"] = "no result (killed at the deadline)" if proc.returncode < 0 else "no result"
    elif run.get("training"):
        why = "killed at the deadline" if proc.returncode < 0 else f"exit {proc.returncode}"
        run["error"] = f"{why} while training (the curve so far is kept)"
    elif proc.returncode < 0 and job["arch"] in WITH_ATTENTION and len(run.get("heads", ())) < 2:
        run["heads_error"] = "killed at the deadline before the analyses finished"
    elif proc.returncode not in (0, None) and "error" not in run:
        run["error"] = f"exit {proc.returncode}"
    if "error" in run or "heads_error" in run:
        run["log_tail"] = Path(log.name).read_text()[-1500:]
    return run


def write_result(out_path: Path, result: dict, procs: list, t0: float) -> dict:
    runs = [collect(*p) for p in procs]
    done = [r for r in runs if not r.get("running")]
    keys = ("arch", "width", "n_heads", "seed", "lr")
    best = [{k: r[k] for k in keys if k in r} for r in best_runs(done)]
    result = {**result, "runs": runs, "best": best, "total_s": round(time.perf_counter() - t0, 1)}
    write_json(out_path, result, indent=1)
    return result


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]))
    else:
        main()
