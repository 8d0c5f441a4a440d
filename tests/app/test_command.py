"""`headhunt app`: its options, and the Streamlit command line it runs."""

from __future__ import annotations

import pytest

from headhunt.cli import build_parser, main
from headhunt.commands import app


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["app", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for default in ("(default: runs)", "(default: 8501)", "(default: 127.0.0.1)"):
        assert default in text


def test_streamlit_binds_to_loopback_and_gets_the_runs_folder(tmp_path):
    args = build_parser().parse_args(["app", "--runs", str(tmp_path), "--port", "9123"])
    argv = app.streamlit_argv(args)
    assert argv[1:4] == ["-m", "streamlit", "run"]
    assert app.app_file().is_file() and argv[4] == str(app.app_file())
    opts = dict(zip(argv[5:-3:2], argv[6:-3:2], strict=True))
    assert opts["--server.address"] == "127.0.0.1"
    assert opts["--server.port"] == "9123"
    assert opts["--server.headless"] == "true"
    assert argv[-3:] == ["--", "--runs", str(tmp_path.resolve())]


def test_a_bad_port_is_one_line_error(capsys):
    assert main(["app", "--port", "0"]) == 2
    assert "--port must be in 1..65535" in capsys.readouterr().err


def test_the_app_reads_the_runs_folder_from_its_arguments(monkeypatch):
    from headhunt.app import data

    monkeypatch.setattr("sys.argv", ["main.py", "--runs", "/x/runs"])
    assert data.default_runs_root() == "/x/runs"
    monkeypatch.setattr("sys.argv", ["main.py"])
    monkeypatch.setenv("HEADHUNT_RUNS", "/y")
    assert data.default_runs_root() == "/y"
