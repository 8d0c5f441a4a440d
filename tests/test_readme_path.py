"""README's newcomer path (issue 29, item 5.4): `make run`, then README's commands in order, as
written. Checked without running models: every run a command reads (`--scores`) was written by
`make run` or an earlier command, and no command writes over an earlier one's run directory
without --resume or --force (it would be refused). tests/test_readme_runs.py runs them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[list[str]]:
    """`make run`'s headhunt command, then every `headhunt ...` line of README's bash blocks."""
    make = (ROOT / "Makefile").read_text()
    run = re.search(r"^run:.*\n\t\$\(BIN\)/(headhunt .*)$", make, re.M)
    assert run, "the Makefile has no `run` target calling headhunt"
    lines = [run.group(1)]
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        lines += [ln for ln in block.splitlines() if ln.startswith("headhunt ")]
    return [shlex.split(ln, comments=True)[1:] for ln in lines]


def value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_readme_commands_read_what_earlier_ones_wrote():
    written: dict[str, list[str]] = {}
    commands = readme_commands()
    assert commands[0][0] == "retrieval"
    read = {value(argv, "--scores") for argv in commands}
    assert value(commands[0], "--out") in read, "no README command reads what `make run` wrote"
    for argv in commands:
        scores = value(argv, "--scores")
        if scores is not None:
            assert scores in written, (
                f"`headhunt {' '.join(argv)}` reads {scores}: nothing wrote it"
            )
        out = value(argv, "--out")
        if out is None or argv[0] == "export":
            continue
        if out in written:
            assert "--resume" in argv or "--force" in argv, f"{out} is written twice"
            if "--resume" in argv:  # reprints the earlier run: the same command
                assert written[out][0] == argv[0]
        written[out] = argv


def test_readme_says_how_to_reach_headhunt_after_make_setup():
    text = (ROOT / "README.md").read_text()
    assert "source .venv/bin/activate" in text or ".venv/bin/headhunt" in text
