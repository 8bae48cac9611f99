"""The docs name only flags and metrics that exist: every `omnitrace SUB --flag` written in
README.md or docs/*.md is in SUB's own --help, and every `omnitrace_*` metric name is one
the agent's registry exposes (a flag renamed or a metric dropped fails here, not in a
user's terminal)."""
from __future__ import annotations

import contextlib
import glob
import importlib
import io
import os
import re
import shlex

import pytest

from omnitrace.agent.export_prometheus import Metrics
from omnitrace.bench.client import PROMPT_TOKENS_FIELD
from omnitrace.cli import COMMANDS
from tests.support.sources import ROOT

DOCS = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
_CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.S)
_STOP = {"|", "&&", ";", "||", ">", "2>&1", "#"}


def _flags(sub: str, cache: dict[str, dict[str, bool]] = {}) -> dict[str, bool]:
    """SUB's flags (from its own --help, in-process) -> whether each takes a value."""
    if sub not in cache:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            importlib.import_module(f"omnitrace.cli.{sub}").main(["--help"])
        found = {"--help": False}
        for flag, value in re.findall(r"(--[a-z][a-z0-9-]*)( [A-Z{][^\s,\]]*)?", out.getvalue()):
            found[flag] = found.get(flag, False) or bool(value)
        cache[sub] = found
    return cache[sub]


def _commands(text: str) -> list[str]:
    """The lines of code (fenced blocks and inline spans) that run `omnitrace SUB`."""
    lines = []
    for block, inline in _CODE.findall(text):
        for line in (block or inline).replace("\\\n", " ").splitlines():
            if re.search(r"(^|\s)omnitrace [a-z]", line):
                lines.append(line)
    return lines


def _tokens(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in prose: plain words
        return line.split()


def _unknown(line: str) -> list[str]:
    """`--flags` on ``line`` that the subcommand they follow does not have. After
    `omnitrace run [options]` comes the command it runs: `serve` is checked as
    `omnitrace serve`, anything else (vllm, python) is not ours to check."""
    bad: list[str] = []
    allowed: dict[str, bool] | None = None
    sub, value_next = None, False
    toks = _tokens(line)
    for i, tok in enumerate(toks):
        if tok in _STOP:
            allowed = None
        elif tok == "omnitrace" and i + 1 < len(toks) and toks[i + 1] in COMMANDS:
            sub, allowed, value_next = toks[i + 1], _flags(toks[i + 1]), False
        elif allowed is None or (tok == sub and toks[i - 1] == "omnitrace"):
            continue
        elif value_next or " " in tok:  # a flag's value (a quoted one may hold spaces)
            value_next = False
        elif tok.startswith("--") and tok != "--":
            name = tok.split("=", 1)[0]
            if name not in allowed:
                bad.append(f"omnitrace {sub} {tok}")
            value_next = allowed.get(name, False) and "=" not in tok
        elif sub == "run" and tok != "--":  # the command `omnitrace run` runs
            sub, allowed = (tok, _flags(tok)) if tok == "serve" else (None, None)
    return bad


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_every_omnitrace_flag_in_the_docs_exists(path):
    with open(path) as f:
        text = f.read()
    bad = sorted({b for line in _commands(text) for b in _unknown(line)})
    assert not bad, f"{os.path.basename(path)} names flags the commands do not have: {bad}"


# flags of other tools the docs name on their own (`--flag` in prose)
FOREIGN = {"py-spy": {"--nonblocking", "--idle", "--gil", "--threads"},
           "vllm serve": {"--load-format", "--max-model-len"}, "pip": {"--no-deps", "--find-links"}}


def test_every_flag_named_alone_exists_somewhere():
    """A flag in prose (`--flag`, no command before it) is some omnitrace command's, a
    script's of ours, or another tool's listed in FOREIGN."""
    ours = {f for sub in COMMANDS for f in _flags(sub)}
    scripts = "".join(open(p).read() for p in glob.glob(os.path.join(ROOT, "scripts", "*.sh")))
    foreign = set().union(*FOREIGN.values())
    bad = set()
    for path in DOCS:
        with open(path) as f:
            for _block, inline in _CODE.findall(f.read()):
                m = re.fullmatch(r"(--[a-z][a-z0-9-]*)(?:[ =]\S+)?", inline.strip())
                if m and m.group(1) not in ours | foreign and m.group(1) not in scripts:
                    bad.add(f"{os.path.basename(path)}: {inline}")
    assert not bad, sorted(bad)


def test_every_metric_named_in_the_docs_is_exposed():
    names = set()
    for fam in Metrics().registry.collect():
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
    for suffix in ("_total", "_bucket", "_sum", "_count"):  # families without samples yet
        names.update(n + suffix for n in list(names))
    missing = set()
    for path in DOCS:
        with open(path) as f:
            for name in re.findall(r"\bomnitrace_[a-z0-9_]+[a-z0-9]", f.read()):
                if name not in names and name not in ("omnitrace_version", PROMPT_TOKENS_FIELD):
                    missing.add(f"{os.path.basename(path)}: {name}")
    assert not missing, sorted(missing)


def test_the_checker_finds_a_flag_that_does_not_exist():
    assert _unknown("omnitrace run --interval-ms 5 serve --snapshot copy") == ["omnitrace run --interval-ms"]
    assert _unknown("omnitrace run --flame serve --no-such-thing") == ["omnitrace serve --no-such-thing"]
    assert _unknown("omnitrace run vllm serve --stage-configs-path x.yaml") == []
