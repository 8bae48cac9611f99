"""`omnitrace sql RUN "SELECT ..."`: a SQL query over a run's tables (docs/tables.md),
answered by DuckDB over Arrow; `omnitrace sql RUN --tables` lists the tables and their
columns."""
from __future__ import annotations

import sys

from omnitrace import console
from omnitrace.cli.helpformat import DefaultsFormatter, OneLineParser


def _parser() -> OneLineParser:
    p = OneLineParser(prog="omnitrace sql", formatter_class=DefaultsFormatter,
                      description="Ask a run your own question: SQL (DuckDB) over its typed tables "
                                  "(requests, stage_visits, fifo_tasks, sender_tasks, segments, ...; "
                                  "--tables lists them, docs/tables.md explains them).")
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("query", nargs="?", metavar="QUERY", help="a SELECT statement")
    p.add_argument("--tables", action="store_true", help="list the tables and their columns, then exit")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="how to write the answer")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    from omnitrace.tables import schema, sql
    if args.tables:
        sys.stdout.write(schema.describe())
        return 0
    if not args.query:
        p.error("a QUERY (or --tables) is needed")
    from omnitrace.analyze import report_tables
    from omnitrace.tables.run import TablesError
    try:
        named = sql.tables_named(args.query)
        wanted = (sql.words(args.query) if named is None else named) & set(schema.TABLES)
        tables = report_tables.load(args.run, wanted).tables if wanted else {}
        result = sql.run(tables, args.query)
    except (sql.QueryError, TablesError) as exc:
        console.say("sql", str(exc))
        return 2
    sys.stdout.buffer.write(sql.render(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
