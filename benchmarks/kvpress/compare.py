"""kvpress's presses against headhunt's head data, through kvpress 0.5.5's own pipeline.

Runs in kvpress's environment (``make kvpress-env``; on a GPU machine the same wheels). Same
model, same examples (``make_examples.py``: context and question token ids, fed to kvpress's
``KVPressTextGenerationPipeline`` stages directly: its dataset loaders need the network), every
press at every ratio. Per example: the prefill of the context under the press (as the
pipeline's ``_forward`` runs it), the KV entries held and kept after it
(``headhunt.kvpress_press.kv_entries``: kvpress masks evicted entries of head-wise presses),
then the pipeline's own greedy ``generate_answer``. Timings are per example (CUDA synchronised).

Presses: none; StreamingLLM; SnapKV; ExpectedAttention; KVzip; AdaKV(ExpectedAttention);
CriticalKV(ExpectedAttention); DuoAttention on the fly (kvpress's scorer fed the bundled essays
instead of BookSum); and from headhunt's retrieval scores: the DuoAttention pattern
(``export --format kvpress``), the LU-KV curve (``lukv``), AdaKV head weights (``adakv``) and
``HeadBudgetPress``; and the next idea, head data no retrieval score holds: each head's attention
spread (``attention_spread``: the share of its attention mass outside the first 4 and last 64
tokens, measured exactly on essay windows) as ``HeadBudgetPress`` budgets, tokens chosen by
expected attention (``hh_spread``) or by recency (``hh_spread_recent``: a per-head StreamingLLM
window). DuoAttention's head ratio is set so the measured share of entries removed equals the
target (kvpress#228); the others take the ratio as is. Responses are scored in headhunt's
environment (``summarize.py``).

``--workers N`` runs the conditions in N processes sharing the GPU (a 135M model leaves it
mostly idle: launch-bound), pulling chunks of examples from one queue in priority order (no
compression, then ratios 0.5 and 0.75, then 0.25 and 0.875), each stopping at ``--deadline``
seconds; their timings are then not per-press timings. A single process then times every
press alone (``--time-examples`` examples at 0.5, after one warm-up), rows marked ``timing``.

    python compare.py --model DIR --examples examples.jsonl --scores retrieval_heads.json \
        --out results.jsonl [--workers 14 --deadline 480]
    python compare.py --random-8b --lengths 32768 --out mem.jsonl   # memory and time only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import queue
import time
from pathlib import Path

import gemma3_rule as g3  # beside this script
import numpy as np
import pandas as pd
import torch
from kvpress import (
    AdaKVPress,
    CriticalKVPress,
    DuoAttentionPress,
    ExpectedAttentionPress,
    KnormPress,
    KVPressTextGenerationPipeline,
    KVzipPress,
    LUKVPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from kvpress.presses import duo_attention_press
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from headhunt.export import ModelShape, export
from headhunt.kvbudget import fold_kv, keep_shares, scaled
from headhunt.kvpress_press import (
    HeadBudgetPress,
    HeadWeightedPress,
    RecencyPress,
    attention_spread,
    kv_entries,
)

RATIOS = (0.25, 0.5, 0.75, 0.875)
DUO_SINK, DUO_RECENT = 128, 256  # kvpress's on-the-fly DuoAttention window, for both patterns
SPREAD_SINK, SPREAD_WINDOW = 4, 64  # HeadBudgetPress's defaults: the tokens every head keeps
# The field's presses, as kvpress ships them (no head data of headhunt's)
FIELD_PRESSES = ("streaming", "snapkv", "expected", "kvzip", "adakv", "criticalkv")
HEAD_PRESSES = (
    "duo_fly",
    "hh_duo",
    "hh_lukv",
    "hh_adakv",
    "hh_budget",
    "hh_spread",
    "hh_spread_recent",
    "hh_duo_snap",
    "hh_duo_union",
)
# Gemma 3 (text-only): every press under kvpress's Gemma 3 rule (global layers only, see
# gemma3_rule.py), then two presses as kvpress ships them for this class (all 18 layers cut,
# suffix _asis), then more scorer presses that run on it
GEMMA_PRESSES = (
    *FIELD_PRESSES,
    "duo_fly",
    "hh_duo",
    "hh_budget",
    "hh_spread_recent",
    "hh_duo_snap",
    "knorm",
    "tova",
    "streaming_asis",
    "snapkv_asis",
)
PRESSES = (*FIELD_PRESSES, *HEAD_PRESSES)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def local_booksum(texts: list[str]):
    """kvpress's DuoAttention on-the-fly scorer samples 50 BookSum chapters through
    ``datasets.load_dataset``; this hands it local texts in the same shape instead."""

    class Local:
        def to_pandas(self):
            return pd.DataFrame({"chapter": texts})

    return lambda *a, **k: Local()


def essays() -> str:
    from importlib import resources

    folder = resources.files("headhunt.heads") / "data" / "haystack"
    return "\n\n".join(
        f.read_text()
        for f in sorted(folder.iterdir(), key=lambda f: f.name)
        if f.name.endswith(".txt")
    )


def essay_windows(tokenizer, n: int, length: int) -> list[list[int]]:
    """``n`` windows of ``length`` tokens of the bundled essays, evenly spaced."""
    ids = tokenizer(essays())["input_ids"]
    if len(ids) < length:
        raise ValueError(f"the essays hold {len(ids)} tokens, fewer than {length}")
    step = max(1, (len(ids) - length) // max(1, n - 1))
    return [ids[i * step : i * step + length] for i in range(n)]


def essay_chunks(n: int = 60, chars: int = 3000) -> list[str]:
    text = essays()
    step = max(1, (len(text) - chars) // n)
    return [text[i * step : i * step + chars] for i in range(n)]


def head_data(model, scores_json: Path, out: Path) -> dict:
    """Export headhunt's retrieval scores in the three formats and read them back as kvpress
    reads them; returns the loaded data and the export time."""
    per = json.loads(scores_json.read_text())
    keys = [tuple(map(int, k.split("-"))) for k in per]
    c = model.config
    matrix = np.zeros((c.num_hidden_layers, c.num_attention_heads))
    for (layer, head), v in zip(keys, per.values(), strict=True):
        matrix[layer, head] = float(np.mean(v)) if v else 0.0
    shape = ModelShape(
        c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    )
    t0 = time.perf_counter()
    export("kvpress", out / "duo", matrix, shape, sink=DUO_SINK, recent=DUO_RECENT)
    export("lukv", out / "lukv", matrix, shape)
    export("adakv", out / "adakv", matrix, shape)
    seconds = time.perf_counter() - t0
    tsv = out / "duo" / "full_attention_heads.tsv"  # ndmin: one KV head a layer (Gemma 3)
    duo = np.clip(np.loadtxt(tsv, delimiter="\t", ndmin=2), 0, 1)
    return {
        "duo": duo,
        "lukv": np.load(out / "lukv" / "budget_curve.npy"),
        "adakv": np.load(out / "adakv" / "head_weights.npy"),
        "kv": fold_kv(matrix, c.num_key_value_heads),
        "export_s": seconds,
        "trials": len(next(iter(per.values()))),
    }


def duo_head_ratio(target: float, length: int) -> float:
    """The head ratio at which DuoAttention removes ``target`` of the entries at ``length``."""
    return min(1.0, target / (1 - (DUO_SINK + DUO_RECENT) / length))


def global_only(press: HeadBudgetPress, layers: list[int]) -> HeadBudgetPress:
    """Under the Gemma 3 rule only the global layers are compressed: their budgets alone make up
    the ratio (the sliding layers keep their window, share 1)."""

    def shares() -> np.ndarray:
        full = np.ones_like(press.head_scores)
        full[layers] = keep_shares(
            scaled(press.head_scores[layers]), 1 - press.compression_ratio, press.floor
        )
        return full

    press.shares = shares
    return press


def union_pattern(retrieval: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """A DuoAttention pattern from two of headhunt's head measurements: each KV head's rank share
    (0..1] by retrieval score and by attention spread (the share of its attention mass outside
    sink + recent, ``attention_spread``), the pattern the larger of the two, ties broken by the
    smaller. The full heads are then the best copiers *and* the widest readers, where the
    retrieval score alone keeps no head of the early layers that read most widely."""
    a, b = rank_share(retrieval), rank_share(spread)
    return np.maximum(a, b) + 1e-6 * np.minimum(a, b)


def rank_share(x: np.ndarray) -> np.ndarray:
    """Each entry's rank over all entries / their number (1 = the largest), ties averaged."""
    flat = np.asarray(x, dtype=float).ravel()
    ranks = np.empty(flat.size)
    ranks[np.argsort(flat, kind="stable")] = np.arange(1, flat.size + 1)
    for v in np.unique(flat):
        ranks[flat == v] = ranks[flat == v].mean()
    return (ranks / flat.size).reshape(np.shape(x))


def duo_snap(
    pattern: np.ndarray, ratio: float, length: int, layers: list[int] | None = None
) -> HeadBudgetPress:
    """The next idea for the RULER-like loss at 0.75: headhunt's DuoAttention pattern with its
    streaming heads keeping SnapKV-chosen tokens (plus 4 sink and 64 recent ones) instead of a
    sink + recent window. The full heads are the ones ``hh_duo`` keeps full at this ratio; the
    streaming heads share what is left of the budget equally, so the entries removed are the
    ratio, as for every other press.

    ``layers``: Gemma 3 under kvpress's Gemma 3 rule, where only these (global) layers are
    compressed: the full heads are those of these layers that ``hh_duo``'s Gemma deployment keeps
    full (``gemma3_rule.duo_window``: as many as it cannot stream), the ratio is of their entries
    alone, and every other layer keeps share 1."""
    pattern = np.asarray(pattern, dtype=float)
    rows = list(range(pattern.shape[0])) if layers is None else list(layers)
    sub = pattern[rows]
    n = sub.size
    if layers is None:
        n_full = n - round(n * duo_head_ratio(ratio, length))
    else:
        streamed, _ = g3.duo_window(ratio, length, n, sink=DUO_SINK, recent=DUO_RECENT)
        n_full = n - streamed
    full = np.zeros(n, dtype=bool)
    full[np.argsort(sub, axis=None, kind="stable")[n - n_full :]] = True
    full = full.reshape(sub.shape)
    rest = ((1 - ratio) * n - n_full) / max(n - n_full, 1)
    if rest < 0:
        raise ValueError(f"{n_full} full heads alone keep more than {1 - ratio} of the entries")
    shares = np.ones_like(pattern)
    shares[rows] = np.where(full, 1.0, rest)
    press = HeadBudgetPress(
        head_scores=pattern,
        press=SnapKVPress(),
        compression_ratio=ratio,
        sink=SPREAD_SINK,
        window=SPREAD_WINDOW,
    )
    press.shares = lambda: shares
    return press


def make_gemma_press(name: str, ratio: float, length: int, data: dict):
    """The Gemma 3 deployments of the head-aware presses (``data["global"]``: the global
    layers): DuoAttention streams whole global KV heads with a window widened so the removal is
    exactly the ratio of the global entries (``gemma3_rule.duo_window``); HeadBudgetPress
    spreads the ratio over the global layers only."""
    layers = [int(i) for i in data["global"]]
    if name in ("hh_duo", "duo_fly"):
        k, window = g3.duo_window(ratio, length, len(layers), sink=DUO_SINK, recent=DUO_RECENT)
        scores = data["duo"] if name == "hh_duo" else data["duo_fly"]
        pattern = (DUO_SINK, window, g3.global_pattern(scores, layers))
        press = DuoAttentionPress(head_compression_ratio=k / scores.size)
        press.load_attention_pattern = lambda model: pattern
        return press
    if name == "hh_budget":
        return global_only(HeadBudgetPress(head_scores=data["kv"], compression_ratio=ratio), layers)
    if name == "hh_duo_snap":
        return duo_snap(data["duo"], ratio, length, layers)
    if name == "hh_spread_recent":
        press = HeadBudgetPress(
            head_scores=data["spread_kv"],
            press=RecencyPress(),
            compression_ratio=ratio,
            sink=SPREAD_SINK,
            window=SPREAD_WINDOW,
        )
        return global_only(press, layers)
    return make_press(name.removesuffix("_asis"), ratio, length, None)


def make_press(name: str, ratio: float, length: int, data: dict | None):
    if data is not None and "global" in data:
        return make_gemma_press(name, ratio, length, data)
    if name == "knorm":
        return KnormPress(compression_ratio=ratio)
    if name == "tova":
        return TOVAPress(compression_ratio=ratio)
    if name == "streaming":
        return StreamingLLMPress(compression_ratio=ratio)
    if name == "snapkv":
        return SnapKVPress(compression_ratio=ratio)
    if name == "expected":
        return ExpectedAttentionPress(compression_ratio=ratio)
    if name == "kvzip":
        return KVzipPress(compression_ratio=ratio)
    if name == "adakv":
        return AdaKVPress(ExpectedAttentionPress(compression_ratio=ratio))
    if name == "criticalkv":
        return CriticalKVPress(ExpectedAttentionPress(compression_ratio=ratio, use_vnorm=False))
    if name == "duo_fly":
        return DuoAttentionPress(
            head_compression_ratio=duo_head_ratio(ratio, length), on_the_fly_scoring=True
        )
    if name == "hh_duo":
        press = DuoAttentionPress(head_compression_ratio=duo_head_ratio(ratio, length))
        pattern = (DUO_SINK, DUO_RECENT, data["duo"])
        press.load_attention_pattern = lambda model: pattern  # the export's README loader
        return press
    if name == "hh_duo_union":
        press = DuoAttentionPress(head_compression_ratio=duo_head_ratio(ratio, length))
        pattern = (DUO_SINK, DUO_RECENT, union_pattern(data["duo"], data["spread_kv"]))
        press.load_attention_pattern = lambda model: pattern
        return press
    if name == "hh_lukv":
        press = LUKVPress(ExpectedAttentionPress(epsilon=2e-2), compression_ratio=ratio)
        press._budget_curves = data["lukv"]
        return press
    if name == "hh_adakv":
        inner = HeadWeightedPress(press=ExpectedAttentionPress(), weights=data["adakv"])
        inner.compression_ratio = ratio
        return AdaKVPress(inner)
    if name == "hh_budget":
        return HeadBudgetPress(head_scores=data["kv"], compression_ratio=ratio)
    if name == "hh_duo_snap":
        return duo_snap(data["duo"], ratio, length)
    if name in ("hh_spread", "hh_spread_recent"):
        tokens = RecencyPress() if name == "hh_spread_recent" else ExpectedAttentionPress()
        return HeadBudgetPress(
            head_scores=data["spread_kv"],
            press=tokens,
            compression_ratio=ratio,
            sink=SPREAD_SINK,
            window=SPREAD_WINDOW,
        )
    raise ValueError(name)


def run_one(pipe, model, press, ex: dict, max_new_tokens: int, gemma: str = "") -> dict:
    """One example as the pipeline's ``_forward`` runs it, timed in two stages. ``gemma``:
    "rule" (Gemma 3 under kvpress's Gemma 3 rule: a cache with transformers' sliding windows and
    positioned global layers) or "asis" (kvpress as shipped for Gemma3ForCausalLM)."""
    device = model.device
    ctx = torch.tensor([ex["context_ids"]], device=device)
    question = torch.tensor([ex["question_ids"]], device=device)
    cache = g3.positioned_cache(model) if gemma == "rule" else DynamicCache()
    sync()
    t0 = time.perf_counter()
    # no_grad around the press too, as the pipeline runs: KVzip scores after its yield
    with torch.no_grad(), press(model) if press is not None else contextlib.nullcontext():
        model.model(input_ids=ctx, past_key_values=cache)
    sync()
    t1 = time.perf_counter()
    held, kept = kv_entries(model, cache)
    per_layer = g3.layer_entries(model, cache) if gemma else None
    with torch.no_grad():
        answer = pipe.generate_answer(
            question_ids=question,
            cache=cache,
            context_length=ctx.shape[1],
            max_new_tokens=max_new_tokens,
        )
    sync()
    t2 = time.perf_counter()
    reported = None
    if press is not None:
        try:
            reported = float(press.compression_ratio)
        except (AssertionError, AttributeError):
            reported = None
    extra = {}
    if per_layer is not None:  # Gemma 3: the global layers apart (the ratio's base)
        glob = g3.global_layers(model)
        extra = {
            "held_global": sum(per_layer[i][0] for i in glob),
            "kept_global": sum(per_layer[i][1] for i in glob),
            "context": int(ctx.shape[1]),
        }
    return {
        "response": answer,
        "held": held,
        "kept": kept,
        **extra,
        "reported_ratio": reported,
        "prefill_s": t1 - t0,
        "decode_s": t2 - t1,
    }


def load(model_dir: str):
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tok, device=model.device)
    return model, tok, pipe


def prepare(a, model, tok, presses: list[str], folder: Path) -> dict:
    """Every press's head data, derived once and timed: headhunt's exports of the retrieval
    scores, kvpress's DuoAttention on-the-fly scores, the attention spread. Saved to
    ``folder/arrays.npz`` for the workers."""
    data = head_data(model, Path(a.scores), folder)
    if g3.is_gemma3_text(model):
        data["global"] = np.array(g3.global_layers(model))
        g3.rope_default_global(True)  # the on-the-fly scorer rotates without a layer type
    duo_attention_press.load_dataset = local_booksum(essay_chunks())
    seconds = {"headhunt_export": data.pop("export_s")}
    t0 = time.perf_counter()
    try:
        if "duo_fly" in presses:
            data["duo_fly"] = duo_attention_press.duo_attention_on_the_fly(model)
    except Exception as e:  # its conditions then record the error
        print(f"DuoAttention on the fly failed: {type(e).__name__}: {e}", flush=True)
    sync()
    seconds["duo_fly"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    windows = essay_windows(tok, a.spread_texts, a.spread_length)
    spread = attention_spread(model, windows, SPREAD_SINK, SPREAD_WINDOW)
    sync()
    seconds["spread"] = time.perf_counter() - t0
    data["spread"] = spread
    data["spread_kv"] = fold_kv(spread, model.config.num_key_value_heads)
    arrays = {k: v for k, v in data.items() if isinstance(v, np.ndarray)}
    np.savez(folder / "arrays.npz", **arrays)
    data["seconds"] = seconds
    return data


def loaded(folder: Path) -> dict:
    with np.load(folder / "arrays.npz") as z:
        data = {k: z[k] for k in z.files}
    if "duo_fly" in data:  # kvpress's on-the-fly scorer, answered from the parent's scores
        scores = data["duo_fly"]
        duo_attention_press.duo_attention_on_the_fly = lambda model, *args, **kw: scores
    return data


def run_condition(pipe, model, name, ratio, examples, data, a, f, **extra) -> None:
    gemma = ""
    if g3.is_gemma3_text(model):
        gemma = "asis" if name.endswith("_asis") else "rule"
    for ex in examples:
        try:
            # Gemma 3: the context's true length sets DuoAttention's window (exact removal)
            length = len(ex["context_ids"]) if gemma else ex["length"]
            press = None if name == "none" else make_press(name, ratio, length, data)
            tokens = ex.get("max_new_tokens", a.max_new_tokens)
            g3.rope_default_global(gemma == "rule")
            with g3.rule(gemma == "rule"):
                rec = run_one(pipe, model, press, ex, tokens, gemma)
        except Exception as e:  # a press that cannot run this model: said, not hidden
            rec = {"error": f"{type(e).__name__}: {e}"[:300]}
        row = {"press": name, "ratio": ratio, "id": ex["id"], **rec, **extra}
        f.write(json.dumps(row) + "\n")
        if "error" in rec:
            break
    f.flush()


def worker(index: int, a, tasks, deadline: float, part: str) -> None:
    torch.set_num_threads(1)
    if torch.cuda.is_available():  # one worker's runaway allocation must not starve the others
        torch.cuda.set_per_process_memory_fraction(a.memory_fraction)
    model, _, pipe = load(a.model)
    data = loaded(Path(a.out).parent / "head_data")
    examples = read_examples(a)
    done = 0
    with open(part, "w") as f:
        while time.time() < deadline:
            try:
                name, ratio, lo, hi = tasks.get_nowait()
            except queue.Empty:
                break
            run_condition(pipe, model, name, ratio, examples[lo:hi], data, a, f)
            done += 1
    print(f"worker {index}: {done} chunks", flush=True)


def interleave(examples: list[dict]) -> list[dict]:
    """The examples with each task spread evenly over the list (its i-th of n at (i + 0.5) / n),
    so that any prefix, e.g. the chunks a deadline left done, holds every task in proportion."""
    seen: dict[str, int] = {}
    counts = {t: sum(e["task"] == t for e in examples) for t in {e["task"] for e in examples}}
    keyed = []
    for i, e in enumerate(examples):
        j = seen[e["task"]] = seen.get(e["task"], -1) + 1
        keyed.append(((j + 0.5) / counts[e["task"]], i, e))
    return [e for *_, e in sorted(keyed, key=lambda t: t[:2])]


def read_examples(a) -> list[dict]:
    lines = Path(a.examples).read_text().splitlines()
    examples = [json.loads(x) for x in lines]
    if a.by_chunk:
        examples = interleave(examples)
    return examples[: a.limit or None]


def compare(a) -> None:
    start = time.time()
    model, tok, pipe = load(a.model)
    examples = read_examples(a)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = out.parent / "head_data"
    gemma = g3.is_gemma3_text(model)
    presses = a.presses.split(",") if a.presses else list(GEMMA_PRESSES if gemma else PRESSES)
    data = prepare(a, model, tok, presses, folder)
    meta = {
        "model": a.model,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "dtype": str(next(model.parameters()).dtype),
        "examples": len(examples),
        "head_data_s": data["seconds"],
        "headhunt_trials": data["trials"],
        "spread_texts": [a.spread_texts, a.spread_length],
        "workers": a.workers,
    }
    (out.parent / (out.stem + "_meta.json")).write_text(json.dumps(meta, indent=2))
    # the ratios the bar is set at first: a run cut short still has them; within a
    # ratio the presses the bar compares (KVzip, the slowest, first; then the head-aware ones
    # and headhunt's), then the plain scorers
    order = sorted(a.ratios, key=lambda r: (r not in (0.5, 0.75), r))
    bar = ("kvzip", "adakv", "criticalkv", *HEAD_PRESSES)
    slow = presses if gemma else sorted(presses, key=lambda p: bar.index(p) if p in bar else 99)
    conds = [("none", 0.0)] + [(p, r) for r in order for p in slow]
    chunk = a.chunk
    los = range(0, len(examples), chunk)
    if a.by_chunk:  # every condition gets the same first chunks: a deadline leaves them paired
        tasks = [(n, r, lo, lo + chunk) for lo in los for n, r in conds]
    else:
        tasks = [(n, r, lo, lo + chunk) for n, r in conds for lo in los]
    deadline = start + a.deadline
    parts = [str(out.parent / f"{out.stem}.part{i}.jsonl") for i in range(a.workers)]
    if a.workers > 1:
        del model, pipe
        torch.cuda.empty_cache()
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        for t in tasks:
            q.put(t)
        procs = [
            ctx.Process(target=worker, args=(i, a, q, deadline, parts[i])) for i in range(a.workers)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        left = 0
        with contextlib.suppress(queue.Empty):
            while True:
                q.get(timeout=1)
                left += 1
        print(f"{len(tasks) - left} of {len(tasks)} chunks done", flush=True)
        model, tok, pipe = load(a.model)
        data = loaded(folder)
        with open(out, "w") as f:
            for part in parts:
                if Path(part).exists():
                    f.write(Path(part).read_text())
    else:
        data = loaded(folder)
        with open(out, "w") as f:
            for n, r in conds:
                if time.time() > deadline:
                    break
                run_condition(pipe, model, n, r, examples, data, a, f)
                print(f"{n} {r} done", flush=True)
    if a.time_examples:
        timed = examples[: a.time_examples + 1]
        with open(out, "a") as f:
            for n, r in [("none", 0.0)] + [(p, 0.5) for p in slow]:
                if time.time() > start + a.deadline + a.time_budget:
                    break
                run_condition(pipe, model, n, r, timed[:1], data, a, f, timing="warm-up")
                run_condition(pipe, model, n, r, timed[1:], data, a, f, timing=True)
    print(f"done in {time.time() - start:.0f} s", flush=True)


def random_8b(a) -> None:
    """Memory and time of the presses on a random Llama-3-8B-shaped model (no accuracy)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    kv = np.random.default_rng(0).random((32, 8))
    data = {
        "duo": kv,
        "kv": kv,
        "adakv": kv / kv.mean(1, keepdims=True) + 0.1,
        "lukv": None,
    }
    from headhunt.kvbudget import lukv_curve

    data["lukv"] = lukv_curve(kv)
    rows = []
    for length in a.lengths:
        ids = torch.randint(0, 128000, (1, length), device="cuda")
        for name, ratio in [("none", 0.0)] + [
            (p, 0.5)
            for p in ("streaming", "snapkv", "expected", "adakv", "hh_duo", "hh_lukv", "hh_budget")
        ]:
            for rep in range(2):  # the first is warm-up
                press = None if name == "none" else make_press(name, ratio, length, data)
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                cache = DynamicCache()
                sync()
                t0 = time.perf_counter()
                with torch.no_grad(), press(model) if press else torch.no_grad():
                    model.model(input_ids=ids, past_key_values=cache)
                sync()
                t1 = time.perf_counter()
                held, kept = kv_entries(model, cache)
                cache_bytes = sum(x.keys.nbytes + x.values.nbytes for x in cache.layers)
                tok = ids[:, -1:]
                with torch.no_grad():
                    for i in range(16):
                        pos = torch.tensor([[length + i]], device="cuda")
                        logits = model(
                            input_ids=tok, past_key_values=cache, position_ids=pos
                        ).logits
                        tok = logits[:, -1:].argmax(-1)
                sync()
                t2 = time.perf_counter()
                row = {
                    "length": length,
                    "press": name,
                    "ratio": ratio,
                    "rep": rep,
                    "held_entries": held,
                    "kept_entries": kept,
                    "cache_bytes_held": cache_bytes,
                    "kept_share": kept / held,
                    "peak_gib_above_start": (torch.cuda.max_memory_allocated() - base) / 2**30,
                    "prefill_s": t1 - t0,
                    "decode_16_s": t2 - t1,
                }
                del cache
                torch.cuda.empty_cache()
                if rep:
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "shape": "Llama-3-8B, random bf16"}
    Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model")
    p.add_argument("--examples")
    p.add_argument("--scores", help="a retrieval run's retrieval_heads.json")
    p.add_argument("--presses", default="")
    p.add_argument("--ratios", type=lambda s: [float(x) for x in s.split(",")], default=RATIOS)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument(
        "--by-chunk",
        action="store_true",
        help="interleave the tasks and queue chunk by chunk (every condition the same examples)",
    )
    p.add_argument("--max-new-tokens", type=int, default=20, help="unless an example sets it")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--chunk", type=int, default=10, help="examples per queued task")
    p.add_argument("--memory-fraction", type=float, default=0.12, help="of the GPU, per worker")
    p.add_argument("--deadline", type=float, default=1e9, help="seconds for the conditions")
    p.add_argument("--time-examples", type=int, default=0, help="then time each press alone")
    p.add_argument("--time-budget", type=float, default=60, help="seconds for the timing")
    p.add_argument("--spread-texts", type=int, default=4)
    p.add_argument("--spread-length", type=int, default=4096)
    p.add_argument("--random-8b", action="store_true")
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[32768])
    p.add_argument("--out", required=True)
    a = p.parse_args()
    random_8b(a) if a.random_8b else compare(a)


if __name__ == "__main__":
    main()
