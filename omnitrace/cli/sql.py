"""`omnitrace sql RUN [RUN ...] "SELECT ..."`: a SQL query over runs' tables (docs/tables.md),
answered by DuckDB over Arrow; without a query, an interactive shell (statements end with
``;``); `omnitrace sql --tables` lists the tables and their columns."""
from __future__ import annotations

import os
import sys

from omnitrace import console
from omnitrace.cli.helpformat import DefaultsFormatter, OneLineParser


def _parser() -> OneLineParser:
    p = OneLineParser(prog="omnitrace sql", formatter_class=DefaultsFormatter,
                      description="Ask runs your own question: SQL (DuckDB) over their typed tables "
                                  "(requests, stage_visits, fifo_tasks, sender_tasks, segments, ...; "
                                  "--tables lists them, docs/tables.md explains them). Several run "
                                  "directories load as one set of tables, a `run` column apart.",
                      epilog='examples:\n  omnitrace sql RUN "SELECT count(*) FROM requests"\n'
                             '  omnitrace sql R1 R2 "SELECT run, count(*) FROM requests GROUP BY run"\n'
                             "  omnitrace sql RUN          (a shell: statements end with ;)")
    p.add_argument("args", nargs="*", metavar="RUN [RUN ...] [QUERY]",
                   help="run directories, then a SELECT statement (none: an interactive shell)")
    p.add_argument("--tables", action="store_true", help="list the tables and their columns, then exit")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="how to write the answer")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_intermixed_args(argv)
    from omnitrace.tables import schema
    if args.tables:
        sys.stdout.write(schema.describe())
        return 0
    runs, query = _runs_and_query(args.args)
    if not runs:
        p.error("a run directory is needed" + (f" ({query!r} is none)" if query else ""))
    from omnitrace.tables import combine
    try:
        combine.distinct(runs)
    except combine.SameRunTwice as exc:
        p.error(str(exc))
    if query is None:
        return _shell(runs, args.format)
    return 0 if _answer(runs, query, args.format) else 2


def _runs_and_query(words: list[str]) -> tuple[list[str], str | None]:
    """The leading directories are runs; a last word that is none is the query."""
    if words and not os.path.isdir(words[-1]):
        return words[:-1], words[-1]
    return words, None


def _answer(runs: list[str], query: str, fmt: str, cache: dict | None = None, said: set | None = None) -> bool:
    """Write ``query``'s answer over ``runs`` (their tables loaded as the query needs them,
    kept in ``cache`` for the next; ``said``: the runs' warnings said already); False, with
    one line on stderr, where it fails."""
    from omnitrace.analyze import report_tables
    from omnitrace.tables import schema, sql
    from omnitrace.tables.run import TablesError
    cache = {} if cache is None else cache
    said = set() if said is None else said
    try:
        named = sql.tables_named(query)
        wanted = (sql.words(query) if named is None else named) & set(schema.TABLES)
        if wanted - set(cache):
            loaded = report_tables.load_runs(runs, wanted - set(cache))
            cache.update(loaded.tables)
            for note in loaded.notes:  # each said once, whichever tables a query loads
                if note not in said:
                    said.add(note)
                    console.say("sql", f"warning: {note}")
        result = sql.run({n: cache[n] for n in wanted}, query)
    except (sql.QueryError, TablesError) as exc:
        console.say("sql", str(exc))
        return False
    sys.stdout.buffer.write(sql.render(result, fmt))
    sys.stdout.flush()
    return True


def _shell(runs: list[str], fmt: str) -> int:
    """Statements from stdin, each ended by ``;``, answered in turn (tables loaded once);
    ``.tables`` lists them, ``.quit`` or end of input leaves."""
    from omnitrace.tables import schema
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    tty = sys.stdin.isatty()
    if tty:
        console.say("sql", f"{len(runs)} run{'s' if len(runs) > 1 else ''}; end a statement with ;  "
                           ".tables lists the tables, .quit leaves")
    cache: dict = {}
    said: set = set()
    pending: list[str] = []
    failed = False
    while True:
        try:
            line = input("sql> " if not pending else "...> ") if tty else sys.stdin.readline()
        except (EOFError, KeyboardInterrupt):
            break
        if not tty and not line:
            break
        text = line.strip()
        if not pending and text in (".quit", ".exit"):
            break
        if not pending and text == ".tables":
            sys.stdout.write(schema.describe())
            continue
        pending.append(line)
        if text.endswith(";"):
            failed |= not _answer(runs, "\n".join(pending).strip().rstrip(";"), fmt, cache, said)
            pending = []
    if "".join(pending).strip():
        failed |= not _answer(runs, "\n".join(pending).strip().rstrip(";"), fmt, cache, said)
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
