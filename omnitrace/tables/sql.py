"""SQL over the tables: DuckDB reading the Arrow tables in place (no copy, no database
file), the answer an Arrow table, written as aligned text, CSV or JSON.

DuckDB is the embedded analytical engine the field reaches for beside Perfetto's trace
processor: it reads Arrow zero-copy, and its SQL has what these questions need (quantiles,
window functions, interval joins, lists).
"""
from __future__ import annotations

import decimal
import io
import re
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv


class QueryError(Exception):
    """A query DuckDB refused: the message in one line."""


def one_line(exc: Exception) -> str:
    """DuckDB's message without its multi-line caret context."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    keep = []
    for ln in lines:
        if ln.startswith("LINE "):
            break
        if ln:
            keep.append(ln)
    return " ".join(keep) or type(exc).__name__


def tables_named(query: str) -> set[str] | None:
    """The table names ``query`` reads (parsed, not bound: its tables need not exist yet);
    None where DuckDB cannot say (a statement other than SELECT). A syntax error raises
    :class:`QueryError`."""
    with duckdb.connect() as con:
        doc = orjson.loads(con.execute("SELECT json_serialize_sql(?)", [query]).fetchone()[0])
    if doc.get("error"):
        if doc.get("error_type") == "parser":
            raise QueryError(f"Parser Error: {doc.get('error_message', 'syntax error')}")
        return None
    names: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if x.get("type") == "BASE_TABLE" and isinstance(x.get("table_name"), str):
                names.add(x["table_name"].lower())
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    return names


def words(query: str) -> set[str]:
    """Every identifier-like word of ``query`` (lower case): the tables a statement DuckDB
    cannot parse for us may read."""
    return {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", query)}


def run(tables: dict[str, pa.Table], query: str) -> pa.Table:
    """``query`` over ``tables`` (each registered under its name)."""
    with duckdb.connect() as con:
        for name, t in tables.items():
            con.register(name, t)
        try:
            return con.sql(query).to_arrow_table()
        except duckdb.CatalogException as exc:
            raise QueryError(f"{one_line(exc)} (the tables: omnitrace sql RUN --tables)") from None
        except duckdb.Error as exc:
            raise QueryError(one_line(exc)) from None


def render(result: pa.Table, fmt: str) -> bytes:
    """``result`` as ``fmt``: "csv", "json" (an array of objects) or "table" (aligned text)."""
    if fmt == "csv":
        buf = io.BytesIO()
        pacsv.write_csv(result, buf)
        return buf.getvalue()
    if fmt == "json":
        return orjson.dumps(result.to_pylist(), option=orjson.OPT_INDENT_2, default=_json_value) + b"\n"
    return _aligned(result).encode()


def _json_value(v: Any) -> Any:
    """What orjson cannot write itself: DuckDB's sums of integers are decimals (HUGEINT)."""
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    raise TypeError(f"{type(v).__name__} is not JSON serializable")


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _aligned(result: pa.Table) -> str:
    """Columns aligned under their names, numbers to the right; then the row count."""
    names = result.column_names
    cols = [[_cell(v) for v in result.column(i).to_pylist()] for i in range(len(names))]
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
               for f in result.schema]
    width = [max([len(n), *map(len, c)]) for n, c in zip(names, cols)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, width, numeric)).rstrip()

    out = [line(names), line(["-" * w for w in width])]
    out += [line([c[r] for c in cols]) for r in range(result.num_rows)]
    out.append(f"({result.num_rows} row{'s' if result.num_rows != 1 else ''})")
    return "\n".join(out) + "\n"
