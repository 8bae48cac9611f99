"""The package's layers hold (docs/architecture.md, "Layers"): a module imports only its
own layer and the ones below, and no two modules import each other, directly or round
about. Read from the source (ast), every import, lazy ones inside functions included."""
from __future__ import annotations

import ast
import os

from tests.support.sources import modules

# lowest first; a module belongs to the layer of its longest matching prefix
LAYERS = [
    ("core", ("omnitrace", "omnitrace.conventions", "omnitrace.categories", "omnitrace.rowops",
              "omnitrace.record", "omnitrace.tracecontext", "omnitrace.eventlog", "omnitrace.spanrows",
              "omnitrace.reqstate", "omnitrace.spantable",
              "omnitrace.otlp", "omnitrace.spanload", "omnitrace.runfiles", "omnitrace.childproc",
              "omnitrace.console", "omnitrace.outages", "omnitrace.keys", "omnitrace.intervals",
              "omnitrace.threads", "omnitrace.requestids")),
    ("tables", ("omnitrace.tables",)),
    ("runtime", ("omnitrace.runtime",)),
    ("profile", ("omnitrace.profile",)),
    ("rules", ("omnitrace.rules",)),
    ("analyze", ("omnitrace.analyze",)),
    ("agent", ("omnitrace.agent",)),
    ("render", ("omnitrace.render",)),
    ("inject", ("omnitrace.inject",)),
    ("patches", ("omnitrace.patches",)),  # hook definitions on inject's Hook API, found by name
    ("runner", ("omnitrace.runner",)),
    ("bench", ("omnitrace.bench",)),
    ("top", ("omnitrace.top",)),
    ("commands", ("omnitrace.cli", "omnitrace.__main__")),
]


def layer_of(module: str) -> int:
    best, rank = "", -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > len(best):
                best, rank = p, i
    return rank


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("omnitrace"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    graph[mod].add(sub if sub in mods else node.module)
            elif isinstance(node, ast.Import):
                graph[mod].update(a.name for a in node.names if a.name.startswith("omnitrace"))
    return {m: {t for t in ts if t in mods and t != m} for m, ts in graph.items()}


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer_of(m) < 0] == []


def upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` that go to a higher layer."""
    return [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
            for m, ts in sorted(graph.items()) for t in sorted(ts) if layer_of(t) > layer_of(m)]


def circles(graph: dict[str, set[str]]) -> list[str]:
    """The import circles of ``graph`` (depth-first, each found once from where it closes)."""
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                found.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_no_import_from_a_higher_layer():
    assert upward(import_graph()) == []


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_the_checks_see_an_upward_import_and_a_circle():
    assert layer_of("omnitrace.cli.report") > layer_of("omnitrace.render.console") \
        > layer_of("omnitrace.analyze.report") > layer_of("omnitrace.spantable")
    assert "omnitrace.rules.span" in import_graph()["omnitrace.rules.attribution"]
    bad = {"omnitrace.spantable": {"omnitrace.analyze.report"}, "omnitrace.analyze.report": set()}
    assert upward(bad) == ["omnitrace.spantable (core) imports omnitrace.analyze.report (analyze)"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]


def reads_files(source: str) -> list[str]:
    """Calls in ``source`` that read input: ``open`` in a mode without 'w', numpy or
    orjson loaders, directory listings."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name == "open":
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            if not (isinstance(mode, ast.Constant) and "w" in str(mode.value)):
                out.append(f"line {node.lineno}: open() to read")
        elif name in ("load", "loads", "listdir", "scandir", "walk", "glob", "read_event_log",
                      "stream_event_log", "load_run"):
            out.append(f"line {node.lineno}: {name}()")
    return out


def test_renderers_load_nothing():
    """A renderer turns what it is given (a report dict, gathered flame graphs) into text,
    HTML or SVG: it opens no input (pyinstrument's renderers see only the session)."""
    found = {m: r for m, path in modules().items() if m.startswith("omnitrace.render")
             for r in [reads_files(open(path, encoding="utf-8").read())] if r}
    assert not found
    assert sorted(reads_files("import os\nwith open(p) as f: pass\nos.listdir(d)\n")) == [
        "line 2: open() to read", "line 3: listdir()"]


def test_every_command_is_a_module_of_the_cli_package_named_after_it():
    """`omnitrace NAME` lives in ``omnitrace/cli/NAME.py``, and that package holds only the
    commands (and the help style they share): one place and one name for each."""
    from omnitrace.cli import COMMANDS
    in_package = {m.rsplit(".", 1)[1] for m in modules() if m.startswith("omnitrace.cli.")}
    assert in_package - {"helpformat"} == set(COMMANDS)


def test_omnitrace_run_puts_the_bootstrap_on_the_path():
    """Moving the command module once left `omnitrace run` pointing at a bootstrap
    directory that did not exist: every child ran uninstrumented, without a word."""
    from omnitrace.runner.command import BOOTSTRAP_DIR
    assert os.path.isfile(os.path.join(BOOTSTRAP_DIR, "sitecustomize.py"))
