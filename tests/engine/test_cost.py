"""Cost up front (issue 29): after a run's second unit (its first, where it has two), one line
says what the run will cost on this device (the first unit's seconds, plus the seconds per
weight measured after it times the weight after it: the first unit pays one-off costs), and the
progress bar's time left comes from the same measurement, per stage and in all. Timed with a
planted clock (each unit takes a known number of "seconds"), never a real one."""

from __future__ import annotations

import pytest

from headhunt import progress
from headhunt.cli import main
from headhunt.progress import UnitProgress


class PlantedClock:
    """Each unit costs ``per_weight`` seconds per weight: the test advances it as it works."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def work(units: UnitProgress, clock: PlantedClock, cost) -> list:
    seen = []
    for u in units:
        clock.now += cost(u)
        seen.append(u)
    return seen


# decoding batches as (trials, length): weight = tokens
BATCHES = [(2, 100), (1, 100), (2, 200), (1, 400)]


def tokens(b) -> float:
    return b[0] * b[1]


def test_the_estimate_is_the_measured_cost_per_weight_times_all_the_weight():
    clock, lines = PlantedClock(), []
    units = UnitProgress(
        BATCHES, "trial", method="retrieval", device="cpu", weight=tokens, count=lambda b: b[0],
        stage=lambda b: b[1], stage_unit="tokens", say=lines.append, bar=False, clock=clock,
    )  # fmt: skip
    assert work(units, clock, lambda b: 0.5 * tokens(b)) == BATCHES  # every unit, in order
    # 0.5 s per token in every batch; all batches: 1,100 tokens
    assert units.estimate_s == pytest.approx(0.5 * 1100)
    assert lines == [
        "retrieval: 6 trials, 100-400 tokens, about 9 min on cpu "
        "(first 2 trials together 100.0 s, next 50.0 s)"
    ]


def test_unweighted_units_cost_the_same_and_a_resumed_run_counts_what_is_left():
    clock, lines = PlantedClock(), []
    units = UnitProgress(
        list(range(4)), "text", method="sinks", device="cuda", done_before=6, say=lines.append,
        bar=False, clock=clock,
    )  # fmt: skip
    work(units, clock, lambda u: 7.0 + u)  # the later units are slower than the first two
    assert units.estimate_s == pytest.approx(7.0 + 3 * 8.0)  # the first, then the second's cost
    assert lines == ["sinks: 4 texts left of 10, about 31 s on cuda (first text 7.0 s, next 8.0 s)"]


def test_a_slow_first_unit_does_not_set_the_estimate_or_the_time_left():
    """A GPU's first unit pays for compiling and tuning its kernels (an H200 taskheads run: 13.2 s
    for the first example, about 0.3 s for each after): the estimate and the time left are the
    later units' cost, not 332 times the first's."""
    clock, lines = PlantedClock(), []
    units = UnitProgress(list(range(332)), "example", method="taskheads", device="cuda",
                         say=lines.append, bar=False, clock=clock)  # fmt: skip
    seen = iter(units)
    next(seen)
    clock.now += 13.2
    next(seen)
    assert lines == []  # not after the first unit: it may be all start-up
    clock.now += 0.3
    next(seen)
    assert units.estimate_s == pytest.approx(13.2 + 331 * 0.3)
    assert lines == [
        "taskheads: 332 examples, about 2 min on cuda (first example 13.2 s, next 0.3 s)"
    ]


def test_two_units_are_estimated_after_the_first():
    clock, lines = PlantedClock(), []
    units = UnitProgress([1, 3], "trial", weight=float, say=lines.append, bar=False, clock=clock)
    work(units, clock, lambda u: 2.0 * u)
    assert units.estimate_s == pytest.approx(8.0) and lines == [
        "2 trials, about 8 s (first trial 2.0 s)"
    ]


def test_one_unit_needs_no_estimate():
    clock, lines = PlantedClock(), []
    units = UnitProgress([1], "trial", say=lines.append, bar=False, clock=clock)
    work(units, clock, lambda u: 3.0)
    assert lines == [] and units.estimate_s is None


def test_the_time_left_is_per_stage_and_in_all_from_the_measured_cost():
    clock = PlantedClock()
    units = UnitProgress(
        BATCHES, "trial", weight=tokens, stage=lambda b: b[1], stage_unit="tokens", say=None,
        bar=False, clock=clock,
    )  # fmt: skip
    # after the first batch (0.5 s per token): 100 tokens left at length 100, 1,000 in all
    assert units._eta(100, 100, 1000, 0.5) == "100 tokens: 0:50, all: 8:20 left"
    assert units._eta(None, 0, 90, 1.0) == "1:30 left"


def test_a_cli_run_says_its_cost_from_its_first_decoding_batch(
    tiny_folder, tmp_path, capsys, monkeypatch
):
    """Every unit of a real retrieval run takes one planted second: the estimate is then the
    total tokens over the first batch's tokens, in seconds, and names the lengths and device."""
    ticks = iter(range(10_000))
    monkeypatch.setattr(progress, "CLOCK", lambda: float(next(ticks)))  # 1 s per unit
    argv = ["retrieval", "--model", str(tiny_folder), "--device", "cpu", "--out",
            str(tmp_path / "run"), "--lengths", "64,128", "--depths", "50", "--needles",
            "passkey,magic", "--max-new-tokens", "2", "--batch-size", "1"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    # 4 trials of one per batch: 1 s, then 64 + 128 + 128 tokens at the second's 1 s per 64
    assert (
        "retrieval: 4 trials, 64-128 tokens, about 6 s on cpu (first trial 1.0 s, next 1.0 s)"
        in out
    )
