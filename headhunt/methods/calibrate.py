"""Attention calibration (ACT, Yu et al. 2024) as a method: a seeded calibration / dev / test
split, head search on the first two, the chosen heads tested on the third. Every evaluation is
a record, so an interrupted search resumes where it stopped."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from headhunt.errors import HeadhuntError
from headhunt.heads.configs import CalibrateConfig
from headhunt.methods.base import Method, print_table, require

RECORDS = "records.jsonl"


def read_heads(spec: str) -> list[tuple[int, int]]:
    """Heads from a heads.json (``{"heads": [[l, h], ...]}``), a text file of ``L-H`` pairs,
    or the pairs themselves (checked against the model later, by
    :func:`headhunt.scores.check_heads`)."""
    from headhunt.scores import parse_heads

    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "heads.json"
    if path.is_file():
        text = path.read_text()
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            heads = parse_heads(text)
        else:
            raw = obj.get("heads") if isinstance(obj, dict) else obj
            try:
                heads = [(int(a), int(b)) for a, b in raw]
            except (TypeError, ValueError):
                raise HeadhuntError(f'{path}: expected {{"heads": [[layer, head], ...]}}') from None
    elif "-" in spec and not spec.endswith((".json", ".txt")):
        heads = parse_heads(spec)
    else:
        raise HeadhuntError(f"no heads file at {path}")
    return heads


class Calibrate(Method):
    name = "calibrate"
    Config = CalibrateConfig
    metric = "movable_sink_mass"
    help = "ACT attention calibration with held-out test"
    units = "screened heads"
    description = """Attention calibration (ACT, Yu et al. 2024) with honest, held-out evaluation.

The task is split (seeded) into calibration / dev / test. Candidate heads (not in the
excluded layers) are ranked by the attention ACT would move off their hidden sinks at the
scored position; the top --max-heads are calibrated one at a time on the calibration split,
heads that raise accuracy are combined greedily on dev, and the chosen set is evaluated on
the test split only: baseline vs calibrated accuracy with paired-bootstrap 95% intervals.
--heads FILE skips the search and applies a saved set (heads.json of an earlier run, or a
text file of LAYER-HEAD pairs). Tasks: a bundled name or a JSONL file (see docs/sinks.md).
Writes manifest.json, scores.parquet, records.jsonl, split.json, heads.json, result.json,
test_items.parquet and calibrate.html."""

    def prepare(self, config: CalibrateConfig) -> None:
        from headhunt.heads.inputs.calibration_tasks import load_task, split_task

        super().prepare(config)
        task = load_task(config.task)  # bad task files fail before the model loads
        split_task(len(task.items), config.n_calib, config.n_dev, config.n_test, config.seed)
        if config.heads:
            read_heads(config.heads)

    def parameters(self, config: CalibrateConfig, model: str) -> dict[str, Any]:
        from headhunt.heads.inputs.calibration_tasks import load_task

        task = load_task(config.task)
        return {
            **config.to_dict(),
            "model": model,
            "task": task.name,
            "task_sha256": _task_hash(task),
            "heads": read_heads(config.heads) if config.heads else None,
        }

    def run(self, model, config: CalibrateConfig, ctx):
        from headhunt.heads.evaluations import calibrate as C
        from headhunt.heads.inputs.calibration_tasks import load_task, split_task
        from headhunt.scores import check_heads

        task = load_task(config.task)
        split = split_task(
            len(task.items), config.n_calib, config.n_dev, config.n_test, config.seed
        )
        enc = C.encode_task(model, task)  # prompts longer than the context fail here
        fixed = read_heads(config.heads) if config.heads else None
        if fixed is not None:
            check_heads(fixed, model.n_layers, model.n_heads)
        layers = [la for la in range(model.n_layers) if la not in config.excluded(model.n_layers)]
        require(fixed is not None or bool(layers), "every layer is excluded; nothing to calibrate")
        if ctx.is_main:
            ctx.write("split.json", split.to_dict(), indent=None)
        act = config.act()
        if kept := len(ctx.records(RECORDS)):
            ctx.say(f"resuming: {kept} finished evaluations kept")
        evaluate = _evaluator(model, enc, act, config.batch_size, ctx)

        t1 = time.perf_counter()
        found = mass = None
        candidates: list = []
        if fixed is None:
            mass, candidates = _candidates(model, enc, split, act, layers, config, ctx)
            _screen(candidates, split, evaluate, ctx)  # every rank meets at its end
            if ctx.is_main:
                found = C.search_heads(evaluate, candidates, split.calibration, split.dev)
                print(
                    f"{len(found.kept)} of {len(candidates)} candidates raise calibration "
                    f"accuracy; {len(found.chosen)} kept by the greedy pass on dev"
                )
        if not ctx.is_main:
            return None
        chosen = fixed if found is None else found.chosen
        saved = {"heads": chosen, "act": act.to_dict(), "task": task.name}
        ctx.write("heads.json", saved, indent=1)
        t_search = time.perf_counter() - t1
        t2 = time.perf_counter()
        test_base = evaluate(("test_base",), split.test, [])
        # With no head chosen the calibrated model is the plain one: reuse the baseline.
        test_cal = evaluate(("test_cal",), split.test, chosen) if chosen else test_base
        t_test = time.perf_counter() - t2
        boot = C.paired_bootstrap(
            test_base["correct"], test_cal["correct"], config.bootstrap, config.seed
        )
        screen, greedy = (found.screen, found.greedy) if found else ([], [])
        result = {
            "task": task.name,
            "heads": chosen,
            "n_candidates": len(screen),
            "n_kept": len(found.kept) if found else 0,
            "n_accepted": len(chosen) if fixed is None else None,
            **boot.to_dict(),
        }
        ctx.collect(RECORDS, _record_order(candidates, greedy, fixed is None, bool(chosen)), _key)
        ctx.write("result.json", result, indent=1)
        base = found.calib_base if found else None
        scores = _write_tables(ctx, model, split, test_base, test_cal, screen, mass, chosen, base)
        ctx.write("calibrate.html", _figure(screen, greedy, base, boot, task.name))
        ctx.timings.update({"search_s": t_search, "test_s": t_test})
        ctx.extra["summary"] = result
        if screen:
            _print_screen(screen, base["acc"])
        return scores

    def show(self, run, top: int) -> None:
        show(run.json("result.json"))


def _evaluator(model, enc, act, batch_size: int, ctx):
    """``evaluate(key, indices, heads, **extra)``: the task's accuracy with ``heads``
    calibrated, a record kept under its key (an interrupted search reuses it)."""
    from tqdm import tqdm

    from headhunt.heads.evaluations import calibrate as C

    def evaluate(key: tuple, indices: list[int], heads, **extra) -> dict:
        def compute() -> dict:
            desc = " ".join(str(k) for k in key)
            show = not ctx.show_progress
            with tqdm(total=len(indices), desc=desc, unit="item", leave=False, disable=show) as bar:
                s = C.evaluate(
                    model, enc, indices, heads=heads, act=act, batch_size=batch_size,
                    progress=bar.update,
                )  # fmt: skip
            rec = {"stage": key[0], **extra, "acc": s.accuracy, "logprob": s.mean_logprob}
            return {**rec, "correct": s.correct.tolist()}

        return ctx.recorded(RECORDS, _key, key, compute)

    return evaluate


def _candidates(model, enc, split, act, layers, config, ctx):
    """The movable sink mass per head (measured once, by rank 0, on the calibration prompts)
    and the candidate heads it ranks."""
    import numpy as np

    from headhunt.heads.evaluations import calibrate as C

    def measure() -> dict:
        print("measuring movable sink mass on the calibration prompts ...")
        m = C.movable_sink_mass(
            model, enc, split.calibration, act, layers, batch_size=config.batch_size
        )
        return {"stage": "mass", "mass": m.tolist()}

    if ctx.is_main:
        ctx.recorded(RECORDS, _key, ("mass",), measure)
    ctx.wait()  # every rank ranks the candidates from rank 0's one measurement
    mass = np.array(ctx.recorded(RECORDS, _key, ("mass",), measure)["mass"])
    excluded = config.excluded(model.n_layers)
    return mass, C.rank_candidates(mass, excluded, config.max_heads)


def _screen(candidates, split, evaluate, ctx) -> None:
    """The baseline and each candidate alone on the calibration split, dealt over the ranks
    (the greedy pass on dev depends on them all and runs on rank 0)."""
    plan = [("calib_base",), *[("screen", la, h) for la, h in candidates]]
    share = ctx.todo(plan)
    done = ctx.done(RECORDS, key=_key)
    todo = [u for u in share if u not in done]
    for unit in ctx.units(todo, "screening", done_before=len(share) - len(todo)):
        heads = [] if unit[0] == "calib_base" else [unit[1:]]
        extra = {} if unit[0] == "calib_base" else {"layer": unit[1], "head": unit[2]}
        evaluate(unit, split.calibration, heads, **extra)
    ctx.wait()


def _record_order(candidates, greedy, searched: bool, calibrated: bool) -> list[tuple]:
    """records.jsonl's order as one process evaluates them, however the work was split."""
    order = [("test_base",), *[("test_cal",)] * calibrated]
    if searched:
        screened = [("screen", la, h) for la, h in candidates]
        steps = [("greedy", i) for i in range(len(greedy))]
        order = [("mass",), ("calib_base",), *screened, ("dev_base",), *steps, *order]
    return order


def _print_screen(screen, base_acc: float) -> None:
    import pandas as pd

    df = pd.DataFrame(screen)[["layer", "head", "acc", "logprob"]]
    df["acc_gain"] = df["acc"] - base_acc
    print_table(
        df.sort_values("acc_gain", ascending=False).head(10), "screening (calibration split)"
    )


def _key(r: dict) -> tuple:
    if r["stage"] == "screen":
        return ("screen", r["layer"], r["head"])
    if r["stage"] == "greedy":
        return ("greedy", r["step"])
    return (r["stage"],)


def _task_hash(task) -> str:
    h = hashlib.sha256()
    for it in task.items:
        h.update(json.dumps([it.prompt, it.choices, it.answer]).encode())
    return h.hexdigest()[:16]


def _write_tables(ctx, model, split, test_base, test_cal, screen, mass, chosen, calib_base):
    import numpy as np
    import pandas as pd

    from headhunt.scores import HeadScores

    tables = []
    if mass is not None:
        tables.append(
            HeadScores.from_matrix("movable_sink_mass", mass, n_kv_heads=model.n_kv_heads)
        )
    nan = np.full((model.n_layers, model.n_heads), np.nan)
    if screen:
        base = calib_base
        gain, lp = nan.copy(), nan.copy()
        for r in screen:
            gain[r["layer"], r["head"]] = r["acc"] - base["acc"]
            lp[r["layer"], r["head"]] = r["logprob"] - base["logprob"]
        tables.append(HeadScores.from_matrix("calib_acc_gain", gain, n_kv_heads=model.n_kv_heads))
        tables.append(HeadScores.from_matrix("calib_logprob_gain", lp, n_kv_heads=model.n_kv_heads))
    sel = np.zeros((model.n_layers, model.n_heads))
    for layer, head in chosen:
        sel[layer, head] = 1.0
    tables.append(HeadScores.from_matrix("chosen", sel, n_kv_heads=model.n_kv_heads))
    scores = HeadScores.concat(tables)
    scores.df = scores.df.dropna(subset=["value"]).reset_index(drop=True)
    items = {
        "item": split.test,
        "baseline_correct": test_base["correct"],
        "calibrated_correct": test_cal["correct"],
    }
    ctx.write("test_items.parquet", pd.DataFrame(items))
    return scores


def _figure(screen, greedy, calib_base, boot, task_name: str):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=(
            "screening: accuracy gain per head (calibration split)",
            "greedy combination (dev split)",
            "test split: accuracy with 95% CI",
        ),
    )
    if screen:
        base = calib_base["acc"]
        fig.add_trace(
            go.Bar(
                x=[f"{r['layer']}-{r['head']}" for r in screen],
                y=[r["acc"] - base for r in screen],
            ),
            row=1,
            col=1,
        )
    if greedy:
        fig.add_trace(
            go.Scatter(
                x=[f"+{g['layer']}-{g['head']}" for g in greedy],
                y=[g["acc"] for g in greedy],
                mode="lines+markers",
                marker={"color": ["green" if g["accepted"] else "gray" for g in greedy]},
            ),
            row=1,
            col=2,
        )
    ys = [boot.baseline, boot.calibrated]
    lo = [boot.baseline_ci[0], boot.calibrated_ci[0]]
    hi = [boot.baseline_ci[1], boot.calibrated_ci[1]]
    fig.add_trace(
        go.Bar(
            x=["baseline", "calibrated"],
            y=ys,
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [h - y for h, y in zip(hi, ys, strict=True)],
                "arrayminus": [y - v for y, v in zip(ys, lo, strict=True)],
            },
        ),
        row=1,
        col=3,
    )
    fig.update_layout(
        title=f"ACT calibration on {task_name}: gain {100 * boot.gain:+.1f} points "
        f"(95% CI {100 * boot.gain_ci[0]:+.1f} to {100 * boot.gain_ci[1]:+.1f})",
        showlegend=False,
        height=500,
        width=1500,
    )
    return fig


def show(result: dict) -> None:
    heads = ", ".join(f"{a}-{b}" for a, b in result["heads"]) or "none"
    print(f"task {result['task']}: calibrated heads: {heads}")
    b, c, g = result["baseline"], result["calibrated"], result["gain"]
    bl, bh = result["baseline_ci"]
    cl, ch = result["calibrated_ci"]
    gl, gh = result["gain_ci"]
    print(
        f"test split ({result['n']} items): baseline {100 * b:.1f}% [{100 * bl:.1f}, "
        f"{100 * bh:.1f}], calibrated {100 * c:.1f}% [{100 * cl:.1f}, {100 * ch:.1f}], "
        f"gain {100 * g:+.1f} points [{100 * gl:+.1f}, {100 * gh:+.1f}] (95% paired bootstrap)"
    )
