"""Cost up front: every method's units of work go through :class:`UnitProgress`, which times the
first units, prints one line with what the run will cost on this device, and keeps a progress
bar whose time left comes from the measured cost (per stage, e.g. per context length, and in
all).

The first unit pays what is paid once (a GPU's kernels compiled and tuned, caches filled: on an
H200 a taskheads run's first example took 13.2 s and the next ones about 0.3 s), so with three
units or more the estimate waits for the second: the first unit's seconds, plus the second's
seconds per weight times the weight after the first. The time left leaves the first unit out
the same way.

Units may be uneven (a decoding batch of 2,000-token trials costs four times one of 500): a
method gives each unit a ``weight`` in whatever its cost grows with (tokens), and the time
left is the remaining weight times the measured seconds per weight. Without weights every
unit counts the same. A resumed run estimates from the units still to do only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

CLOCK: Callable[[], float] = time.perf_counter  # the default timer (tests plant their own)


def duration(seconds: float) -> str:
    """A rough, readable duration: "40 s", "6 min", "1.5 h"."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def clock_time(seconds: float) -> str:
    """The progress bar's time left, as m:ss or h:mm:ss."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 or word.endswith("s") else f"{n} {word}s"


def span(values: Sequence[Hashable], unit: str) -> str:
    """The stages' range: "500-2000 tokens" for numbers, else the names ("ngram, random")."""
    vals = list(dict.fromkeys(values))
    if not vals:
        return ""
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
        lo, hi = min(vals), max(vals)  # type: ignore[type-var]
        text = f"{lo}" if lo == hi else f"{lo}-{hi}"
    else:
        text = ", ".join(map(str, vals[:4])) + (", ..." if len(vals) > 4 else "")
    return f"{text} {unit}".strip()


@dataclass
class UnitProgress(Generic[T]):
    """Iterate over a method's units of work (its share not done yet), timing each.

    After the second unit (the first, where there are only two), one line: "<method>: <items>,
    <stages>, about <time> on <device> (first <unit> <seconds> s, next <seconds> s)" (with
    "left of" when resumed); every unit moves a progress bar that shows the time left in the
    current stage and in all, from the measured seconds per weight after the first unit.

    Attributes:
        units: the units this process will do, in order.
        what: the name of one item ("trial"); a unit holds ``count(unit)`` items.
        method: the method's name, starting the estimate line.
        device: where the run computes ("cpu", "cuda").
        weight: a unit's cost in any measure its time grows with (default 1 per unit).
        count: items in a unit (default 1; a decoding batch of 8 trials: 8).
        stage: the stage a unit belongs to (a context length, a source), shown in the bar
            with its own time left; ``stage_unit`` names it ("tokens").
        done_before: items an earlier process already finished (a resumed run).
        say: where the estimate line goes; bar: show the progress bar.
        clock: seconds now (default :data:`CLOCK`; a planted clock in tests).
    """

    units: Sequence[T]
    what: str = "unit"
    method: str = ""
    device: str = ""
    weight: Callable[[T], float] | None = None
    count: Callable[[T], int] | None = None
    stage: Callable[[T], Hashable] | None = None
    stage_unit: str = ""
    done_before: int = 0
    say: Callable[[str], None] | None = print
    bar: bool = True
    clock: Callable[[], float] | None = None  # default: CLOCK
    line: str | None = field(default=None, init=False)  # the estimate, once printed
    estimate_s: float | None = field(default=None, init=False)

    def _weight(self, u: T) -> float:
        return float(self.weight(u)) if self.weight else 1.0

    def _count(self, u: T) -> int:
        return int(self.count(u)) if self.count else 1

    def __iter__(self) -> Iterator[T]:
        from tqdm.auto import tqdm

        clock = self.clock or CLOCK
        units = list(self.units)
        weights = [self._weight(u) for u in units]
        stages = [self.stage(u) for u in units] if self.stage else [None] * len(units)
        items = sum(self._count(u) for u in units)
        left_in_stage: dict[Hashable, float] = {}
        for s, w in zip(stages, weights, strict=True):
            left_in_stage[s] = left_in_stage.get(s, 0.0) + w
        left = sum(weights)
        spent = done = 0.0
        first: tuple[float, float] = (0.0, 0.0)  # the first unit's seconds and weight
        bar = tqdm(
            total=items,
            desc=f"{self.method} {self.what}s".strip() if self.what else self.method,
            unit=self.what,
            disable=not self.bar,
            leave=False,
            # the bar's own remaining time assumes even units; the measured one is the postfix
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
        )
        try:
            for i, (unit, w, s) in enumerate(zip(units, weights, stages, strict=True)):
                t0 = clock()
                yield unit
                seconds = clock() - t0
                spent, done, left = spent + seconds, done + w, left - w
                left_in_stage[s] -= w
                if i == 0:
                    first = (seconds, w)
                warm_s, warm_w = (spent, done) if i == 0 else (spent - first[0], done - first[1])
                per_weight = warm_s / warm_w if warm_w > 0 else float("nan")
                if (i == 0 and len(units) == 2) or (i == 1 and len(units) > 2):
                    next_s = seconds if i == 1 else None
                    self._estimate(units, weights, stages, items, first, per_weight, next_s)
                bar.set_postfix_str(self._eta(s, left_in_stage.get(s, 0.0), left, per_weight))
                bar.update(self._count(unit))
        finally:
            bar.close()

    def _estimate(self, units, weights, stages, items, first, per_weight, next_s) -> None:
        """The one line: the first unit's seconds, and the seconds per weight measured after it
        (from the first itself when it is one of two) times the weight after the first."""
        seconds, first_weight = first
        rest = sum(weights) - first_weight
        self.estimate_s = seconds + per_weight * rest if rest > 0 else seconds
        n_first = self._count(units[0])
        first_text = (
            f"first {self.what}" if n_first == 1 else f"first {n_first} {self.what}s together"
        )
        measured = f"{first_text} {seconds:.1f} s"
        if next_s is not None:
            measured += f", next {next_s:.1f} s"
        head = plural(items, self.what)
        if self.done_before:
            head = f"{head} left of {items + self.done_before}"
        parts = [head]
        if self.stage and self.stage_unit:
            parts.append(span(stages, self.stage_unit))
        where = f" on {self.device}" if self.device else ""
        self.line = (
            f"{self.method + ': ' if self.method else ''}{', '.join(parts)}, about "
            f"{duration(self.estimate_s)}{where} ({measured})"
        )
        if self.say is not None:
            self.say(self.line)

    def _eta(self, stage, stage_left: float, left: float, per_weight: float) -> str:
        total = f"{clock_time(left * per_weight)} left"
        if self.stage is None or stage_left <= 0:
            return total
        name = f"{stage} {self.stage_unit}".strip()
        return f"{name}: {clock_time(stage_left * per_weight)}, all: {total}"
