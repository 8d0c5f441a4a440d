"""The run engine: every method's run directory goes through one lifecycle.

    open <out>.partial (locked; resumed or refused) -> a finished run is reprinted, no model
    loaded -> the model loads -> the method computes through a :class:`RunContext` (whole units
    of work dealt over ranks, finished units skipped, records appended to per-rank shards,
    merged in plan order; compute-once steps kept across resumes; files written atomically) ->
    rank 0 writes scores.parquet and the manifest and renames the folder into place.

``headhunt.run(method, config, model=..., out=...)`` is the library's entry point; the CLI's
method subcommands call the same :func:`execute`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from headhunt.errors import HeadhuntError

if TYPE_CHECKING:
    from headhunt.distributed import Dist
    from headhunt.methods.base import Method, MethodConfig
    from headhunt.probes.hooked import HookedModel
    from headhunt.progress import UnitProgress
    from headhunt.rundir import Run, RunDir

T = TypeVar("T")


@dataclass
class ModelSpec:
    """How to load a model: what ``--model``, ``--device``, ``--dtype``, ``--device-map`` and
    ``--trust-remote-code`` say."""

    spec: str = "smollm2-135m"
    device: str = "auto"
    dtype: str = "auto"
    device_map: str | None = None
    trust_remote_code: bool = False
    cache: bool = True  # False: --no-cache (a GGUF's parsed metadata is not kept)

    def load(self) -> HookedModel:
        from headhunt.probes.hooked import load_model

        return load_model(
            self.spec,
            device=self.device,
            dtype=self.dtype,
            trust_remote_code=self.trust_remote_code,
            device_map=self.device_map,
            cache=self.cache,
        )


@dataclass
class RunContext:
    """What a method's ``run`` writes through: the run directory, this process's place in the
    group, and the run's timings and manifest extras.

    Units of work: take this rank's share of the plan that is not done yet with :meth:`todo`,
    iterate over it with :meth:`units` (the cost said after the first unit, time left in the
    progress bar), save each finished unit with :meth:`append`, then :meth:`collect` (every
    rank waits there; rank 0 gets every record in plan order, the others None and return).
    """

    run_dir: RunDir
    dist: Dist
    progress: bool = True
    method: str = ""  # names the run in its cost line
    device: str = ""  # where it computes ("cpu", "cuda"), said with the estimate
    clock: Callable[[], float] | None = None  # the units' timer (None: headhunt.progress.CLOCK)
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    _recorded: dict[str, dict] = field(default_factory=dict, repr=False)

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    @property
    def show_progress(self) -> bool:
        return self.progress and self.dist.is_main

    def path(self, name: str) -> Path:
        """Where the run's file ``name`` is written."""
        return self.run_dir.path(name)

    def write(self, name: str, obj: Any, **options: Any) -> Path:
        """Write the run's file ``name`` atomically (a temporary, then a rename), in the format
        its suffix names (see :func:`headhunt.atomic.write_file`: json, jsonl, csv, tsv,
        parquet, html, safetensors, png); a function is called with the temporary path to fill
        instead (a folder, or a format of its own). Every file a method writes goes through
        here, so a crash never leaves half of one."""
        from headhunt.atomic import write_atomic, write_file

        if callable(obj):
            return write_atomic(self.path(name), obj)
        return write_file(self.path(name), obj, **options)

    def say(self, text: str) -> None:
        """Print on rank 0 only."""
        if self.dist.is_main:
            print(text)

    def records(self, name: str) -> list[dict[str, Any]]:
        """Every record saved under ``name`` so far, by any rank or earlier process."""
        from headhunt.distributed import shard_records

        return shard_records(self.run_dir, name)

    def done(self, name: str, key: Callable[[dict], Hashable]) -> set:
        """Keys of the units already recorded under ``name``."""
        return {key(r) for r in self.records(name)}

    def todo(self, plan: list[T], done: Iterable[Hashable] = (), key=lambda u: u) -> list[T]:
        """This rank's share of ``plan`` (every world-th whole unit; the same split however the
        run was interrupted), less the units whose ``key`` is done."""
        done = set(done)
        return [u for u in self.dist.share(plan) if not done or key(u) not in done]

    def units(
        self,
        todo: Sequence[T],
        what: str = "unit",
        *,
        weight: Callable[[T], float] | None = None,
        count: Callable[[T], int] | None = None,
        stage: Callable[[T], Hashable] | None = None,
        stage_unit: str = "",
        done_before: int = 0,
        bar: bool = True,
    ) -> UnitProgress[T]:
        """Iterate over this rank's units (from :meth:`todo`) with the cost said up front:
        after the first unit, one line with the items, the stages and the expected time on
        this device from the first unit's measured seconds (per ``weight``: uneven units such
        as decoding batches of different lengths weigh their tokens); the progress bar shows
        the time left per ``stage`` (a length) and in all. A resumed run passes the items
        already done (``done_before``) and estimates from what is left. ``bar`` False keeps
        the line and hides the bar (a method's own --no-progress). See
        :class:`headhunt.progress.UnitProgress`."""
        from headhunt.progress import UnitProgress

        def say(text: str) -> None:
            from tqdm import tqdm

            tqdm.write(text)

        return UnitProgress(
            todo, what, method=self.method, device=self.device, weight=weight, count=count,
            stage=stage, stage_unit=stage_unit, done_before=done_before,
            say=say if self.show_progress else None, bar=bar and self.show_progress,
            clock=self.clock,
        )  # fmt: skip

    def append(self, name: str, record: dict[str, Any]) -> None:
        """Save one finished unit durably, in this rank's shard of ``name``."""
        from headhunt.distributed import shard_name

        self.run_dir.append_record(record, shard_name(self.dist, name))

    def wait(self, timing: str | None = None, since: float | None = None) -> None:
        """Every rank waits here for the others; ``timing`` records the slowest rank's time
        since ``since``."""
        elapsed = time.perf_counter() - since if since is not None else 0.0
        slowest = max(self.dist.gather(elapsed))
        if timing is not None:
            self.timings[timing] = slowest

    def collect(
        self, name: str, keys: list[Hashable], key: Callable[[dict], Hashable]
    ) -> list[dict[str, Any]] | None:
        """Rank 0: the records of ``name`` in plan order (``keys``), written back as one file
        (so the run directory does not depend on how the work was split or resumed). Other
        ranks: None. Call :meth:`wait` first."""
        from headhunt.distributed import merge_records

        if not self.dist.is_main:
            return None
        by_key = {key(r): r for r in self.records(name)}
        missing = [k for k in keys if k not in by_key]
        if missing:
            raise HeadhuntError(f"{name} lacks {len(missing)} unit(s) (first: {missing[0]!r})")
        records = [by_key[k] for k in keys]
        merge_records(self.run_dir, name, records)
        return records

    def recorded(
        self,
        name: str,
        key: Callable[[dict], Hashable],
        unit: Hashable,
        compute: Callable[[], dict[str, Any]],
    ) -> dict[str, Any]:
        """A keyed compute-once record: the record of ``unit`` (``key(record) == unit``) saved
        under ``name`` by any rank or an earlier process, else ``compute()``'s, saved now. For
        work whose units are known only as it goes (a greedy search)."""
        cache = self._recorded.setdefault(name, {})
        if unit not in cache:
            cache.update({key(r): r for r in self.records(name)})
        if unit not in cache:
            cache[unit] = compute()
            self.append(name, cache[unit])
        return cache[unit]

    def run_conditions(
        self,
        name: str,
        conditions: dict[str, Any],
        measure: Callable[[Any], dict[str, Any]],
        *,
        timing: str | None = None,
    ) -> dict[str, dict[str, Any]] | None:
        """Conditions as units of work (condition name -> what to apply, such as the heads of
        :meth:`~headhunt.heads.evaluations.causal.MaskingCheck.conditions`): each rank measures its share
        not done yet and saves ``{"condition": name, **measure(what)}`` under ``name``; every
        rank waits (``timing`` records the slowest); rank 0 gets the records by condition, in
        plan order, the others None."""

        def key(r: dict) -> str:
            return r["condition"]

        t0 = time.perf_counter()
        todo = self.todo(list(conditions), self.done(name, key=key))
        done_before = len(self.dist.share(list(conditions))) - len(todo)
        for c in self.units(todo, "condition", done_before=done_before):
            self.append(name, {"condition": c, **measure(conditions[c])})
        self.wait(timing, since=t0)
        records = self.collect(name, list(conditions), key=key)
        return None if records is None else {key(r): r for r in records}

    def step(self, name: str, compute: Callable[[], Any]) -> Any:
        """A compute-once step, called by every rank: rank 0 computes ``compute()`` and keeps
        its result in ``name`` (``.json``: JSON; ``.safetensors``: a dict of tensors; written
        atomically), or finds it there when the run is resumed; every rank waits for it and
        gets what the file holds."""
        path = self.path(name)
        if self.dist.is_main and not path.is_file():
            self.write(name, compute())
        self.wait()
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        import json

        return json.loads(path.read_text())


def execute(
    method: Method,
    config: MethodConfig,
    *,
    out: str | Path,
    model: HookedModel | None = None,
    spec: ModelSpec | None = None,
    seed: int = 0,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    show: bool = True,
    top: int | None = None,
) -> Path | None:
    """Run ``method`` into ``out`` in this process (one rank of a group under torchrun, or
    alone). Returns the finished run directory on rank 0, None on the other ranks."""
    from headhunt import distributed
    from headhunt.rundir import load_run

    if model is None and spec is None:
        raise HeadhuntError("give a model or a model spec")
    method.prepare(config)  # everything checkable without the model fails now
    if spec is not None and spec.device_map is None:
        from headhunt.probes.hooked import pick_device

        device = pick_device(spec.device).type  # an absent device (--device mps) fails now
    else:
        device = "cuda" if model is None else model.device.type  # a device map spreads GPUs
    config = method.for_device(config, device)  # defaults sized to the device, recorded
    name = spec.spec if model is None else _model_name(model)
    params = method.run_parameters(config, name, spec)
    dist = distributed.init()
    finished = False
    try:
        if dist.active and spec is not None:
            spec.device = dist.device(spec.device)
        run_dir = distributed.open_run(
            dist, out, method.name, resume=resume, force=force, parameters=params
        )
        if run_dir.complete:  # reprinted without loading the model
            if show and dist.is_main:
                method.show(load_run(run_dir.out), method.top if top is None else top)
            finished = True
            return run_dir.out if dist.is_main else None
        seed_everything(seed)
        t0 = time.perf_counter()
        if model is None:
            model = method.load(spec)
        if getattr(model, "attention_free", False) and not method.runs_attention_free:
            model._refuse_attention_free()  # a method that only scores heads: refuse now
        if getattr(model, "codebooks", 1) > 1:  # MusicGen Melody: a token is a codebook tuple
            model.refuse_codebook_rows(method.name)
        check_same_model(run_dir, model, write=dist.is_main)
        ctx = RunContext(
            run_dir, dist, progress=progress, method=method.name, device=model.device.type
        )
        ctx.timings["load_model_s"] = time.perf_counter() - t0
        bias_line = getattr(model, "score_bias_line", lambda: None)()
        if bias_line:  # such layers run the torch path on every device: say so once
            ctx.say(bias_line)
        scores = method.run(model, config, ctx)
        finished = True
        if not dist.is_main:
            return None
        from headhunt.rundir import SCORES

        ctx.write(SCORES, scores)
        path = run_dir.finalize(
            model=model.describe(),
            parameters=params,
            timings=ctx.timings,
            extra={"processes": dist.world, **ctx.extra},
        )
        if show:
            method.show(load_run(path), method.top if top is None else top)
            print(f"run directory: {path}")
        return path
    except HeadhuntError as e:
        if dist.is_main:
            raise
        distributed.report_rank_error(f"headhunt {method.name}: error: {e}")
        raise SystemExit(2) from None
    finally:
        if dist.active:
            dist.close(finished)


# The model a run's finished units were computed with, kept in its work folder for --resume.
MODEL_IDENTITY = ".model.json"


def model_identity(model: HookedModel) -> dict[str, Any]:
    """What must not change when a run resumes: the weights (content hash, else the spec),
    the dtype and the device type (cuda:0 and cuda:1 are the same kind of device)."""
    facts = model.describe()
    return {
        "name": facts.get("name"),
        "weights_sha256": facts.get("weights_sha256"),
        "dtype": facts.get("dtype"),
        "device": str(facts.get("device", "")).split(":")[0],
    }


def check_same_model(run_dir: RunDir, model: HookedModel, *, write: bool = True) -> None:
    """Refuse, in one line, to resume a run's finished units with another model's weights,
    another dtype or another device type (their scores would be averaged together); the first
    process to start the run records the model (``write``)."""
    import json

    from headhunt.rundir import write_json_atomic

    path = run_dir.path(MODEL_IDENTITY)
    now = model_identity(model)
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        before = None
    if not isinstance(before, dict):
        if write and run_dir.work != run_dir.out:
            write_json_atomic(path, now)
        return
    changed = [
        f"{k} {before.get(k)} -> {now[k]}"
        for k in ("weights_sha256", "dtype", "device")
        if before.get(k) is not None and now[k] is not None and before.get(k) != now[k]
    ]
    if changed:
        what = "; ".join(
            c
            if not c.startswith("weights")
            else f"weights of {before.get('name')} -> {now['name']}"
            for c in changed
        )
        raise HeadhuntError(
            f"{run_dir.work} was started with another model setting ({what}); resume with the "
            "same --model, --dtype and --device, or pass --force to start over"
        )


def _model_name(model: HookedModel) -> str:
    return str(model.describe().get("spec") or model.name)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch. With ``HEADHUNT_DETERMINISTIC=1`` also ask torch, cuBLAS
    and cuDNN for deterministic kernels (and keep SDPA off cuDNN's heuristic engines)."""
    import os
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if os.environ.get("HEADHUNT_DETERMINISTIC", "") not in ("", "0"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.enable_cudnn_sdp(False)


def run(
    method: str,
    config: MethodConfig | dict[str, Any] | None = None,
    *,
    model: HookedModel | None = None,
    model_spec: str | ModelSpec | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    nproc: int = 1,
    seed: int | None = None,
    progress: bool = True,
    show: bool = False,
) -> Run:
    """Run a registered method and return the finished run, read back.

    Args:
        method: a name in :data:`headhunt.methods.METHODS` ("retrieval", "sinks", ...).
        config: the method's config (its dataclass, a dict of its fields, or None for the
            defaults).
        model: an in-memory :class:`~headhunt.probes.hooked.HookedModel` (nothing is saved to
            disk), or
        model_spec: what to load (a registry name, folder, .gguf file, or a :class:`ModelSpec`).
        out: the run directory (default ``runs/<method>``).
        resume, force: as the CLI's ``--resume`` / ``--force``.
        nproc: processes, one model replica each (needs ``model_spec``: each process loads its
            own; runs ``headhunt <method> ... --nproc N``).
        seed: the random seed (default: the config's ``seed``, else 0).
        progress, show: progress bars; print the run's tables as the CLI does.

    Raises:
        HeadhuntError: bad config, bad model, or a run directory that cannot be written.
    """
    from headhunt import methods
    from headhunt.rundir import discard_unstarted_runs, load_run, open_runs, release_runs

    m = methods.get(method)
    if config is None:
        config = m.Config()
    elif isinstance(config, dict):
        config = m.Config.from_options(config)
    elif not isinstance(config, m.Config):
        raise HeadhuntError(f"{method} takes a {m.Config.__name__}, not {type(config).__name__}")
    if seed is None:
        seed = getattr(config, "seed", 0)
    if (model is None) == (model_spec is None):
        raise HeadhuntError("give exactly one of model (in memory) and model_spec (to load)")
    spec = ModelSpec(model_spec) if isinstance(model_spec, str) else model_spec
    out = Path(out if out is not None else f"runs/{m.name}")
    if nproc > 1:
        return _run_group(m, config, spec, out, resume, force, nproc, seed)
    mark = open_runs()
    try:
        execute(
            m, config, out=out, model=model, spec=spec, seed=seed, resume=resume, force=force,
            progress=progress, show=show,
        )  # fmt: skip
    except BaseException:
        discard_unstarted_runs(mark)
        raise
    release_runs(mark)
    return load_run(out)


def _run_group(m, config, spec, out, resume, force, nproc, seed) -> Run:
    """``headhunt.run(..., nproc=N)``: the CLI's group launcher on the same settings."""
    from headhunt import distributed
    from headhunt.rundir import load_run

    if spec is None:
        raise HeadhuntError("nproc > 1 needs model_spec: each process loads its own replica")
    m.prepare(config)
    argv = [m.name, *config.to_argv(), "--model", spec.spec, "--device", spec.device]
    argv += ["--dtype", spec.dtype, "--seed", str(seed), "--out", str(out)]
    argv += ["--trust-remote-code"] * spec.trust_remote_code + ["--no-cache"] * (not spec.cache)
    argv += ["--resume"] * resume + ["--force"] * force
    code = distributed.launch_if_asked(nproc, [*argv, "--nproc", str(nproc)], device=spec.device)
    if code:
        raise HeadhuntError(f"the {nproc}-process {m.name} run failed (exit status {code})")
    return load_run(out)
