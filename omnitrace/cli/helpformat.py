"""One help style for every omnitrace command: defaults shown where they say something."""
from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to an option's help when X is a real value; ``None``,
    ``False`` and empty defaults mean "off" or "see the help text" and are not printed
    (argparse's own ArgumentDefaultsHelpFormatter prints them all)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or default in (None, False, "", [], argparse.SUPPRESS)
                or action.option_strings == [] and action.nargs in ("?", "*") and not default
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {shown})"


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake as one line on stderr, ``PROG: MESSAGE (see PROG --help)``, exit 2
    (argparse prints the whole usage first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")
