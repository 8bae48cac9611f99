"""CLI hygiene in process: a Ctrl-C that lands while a command starts is one line. The rest,
on real commands: tests/system/cli/test_cli_hygiene.py."""
from __future__ import annotations


def test_ctrl_c_while_a_command_starts_is_one_line(monkeypatch, capsys):
    """Ctrl-C that lands before a command handles it itself (while its modules import,
    seconds on a loaded machine: seen as a traceback from `loadtest`'s bench) exits 130
    with one line."""
    import importlib

    from omnitrace import cli

    def interrupted(name: str):
        raise KeyboardInterrupt
    monkeypatch.setattr(importlib, "import_module", interrupted)
    assert cli.main(["bench", "--base-url", "http://127.0.0.1:1"]) == 130
    err = capsys.readouterr().err
    assert err == "omnitrace bench: interrupted\n"
