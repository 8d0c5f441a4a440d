"""`headhunt app`: the Streamlit dashboard over a folder of run directories."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from headhunt.commands.common import add_command, require

DESCRIPTION = """Browse run directories in a Streamlit dashboard: the runs, a layer x head map of
any metric, one head's scores, spread and attention on a prompt, head masking / ACT on a
needle-in-a-haystack prompt (before and after), and SAE circuits with their ROC curves.
It listens on --host (loopback by default: the dashboard runs models on request, so expose
it to a network only on purpose). Stop it with Ctrl-C."""


def add_parser(sub) -> None:
    p = add_command(sub, "app", "the dashboard (Streamlit) over run directories", DESCRIPTION)
    p.add_argument("--runs", default="runs", help="folder holding run directories")
    p.add_argument("--port", type=int, default=8501, help="port to listen on")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (server.address)")
    p.add_argument(
        "--browser", action="store_true", help="open a browser tab (default: headless server)"
    )
    p.set_defaults(func=run)


def app_file() -> Path:
    """The installed dashboard script (headhunt.app.main)."""
    import headhunt.app

    return Path(headhunt.app.__file__).with_name("main.py")


def streamlit_argv(args: argparse.Namespace) -> list[str]:
    """The `python -m streamlit run ...` command line this command executes."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app_file()),
        "--server.address",
        args.host,
        "--server.port",
        str(args.port),
        "--server.headless",
        "false" if args.browser else "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",  # no "Deploy" button: this is a local tool
        # A widget whose value the session sets gets that value as its default too
        # (app/views.py, kept, says why); Streamlit would log a stack for that once per server.
        "--global.disableWidgetStateDuplicationWarning",
        "true",
        "--",
        "--runs",
        str(Path(args.runs).expanduser().resolve()),
    ]


def run(args: argparse.Namespace) -> int:
    import importlib.util

    require(1 <= args.port <= 65535, f"--port must be in 1..65535, got {args.port}")
    require(
        importlib.util.find_spec("streamlit") is not None,
        "the dashboard needs streamlit: pip install streamlit",
    )
    runs = Path(args.runs).expanduser()
    if not runs.is_dir():
        print(f"note: {runs} does not exist yet; the dashboard will say how to make a run")
    argv = streamlit_argv(args)
    env = {**os.environ, "HEADHUNT_RUNS": argv[-1]}
    print(f"headhunt dashboard on http://{args.host}:{args.port} (runs: {argv[-1]})", flush=True)
    # Replace this process with Streamlit's: Ctrl-C and kill reach the server directly.
    os.execve(sys.executable, argv, env)
    return 0  # pragma: no cover - execve does not return
