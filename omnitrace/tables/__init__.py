"""Typed per-kind tables of a run: what users query (`omnitrace sql`), export (Parquet,
Perfetto) and, in time, what every analysis reads.

Shaped after Perfetto's trace processor: one table per kind of thing, typed and documented
columns (``schema.TABLES``: the one place; docs/tables.md lists them), variants as their
own tables (each chunk span kind: ``snapshots``, ``fifo_tasks``, ``payloads``, ``puts``,
``gets``, ``waits``, ``poll_lags``), identity as integer foreign keys (``request_id``,
``sender_id``, ``thread_id``; the request id string only in ``requests``), composite keys
packed by one function (``keys.pack``). Arrow tables are the exchange format.

* ``run.load(RUN_DIR)``: a run directory's tables, made by ``build.TablesSink``, a sink
  of the one loader (``omnitrace.spanload``), plus bench.json's requests.
* ``perfetto.write``: the tables as a Perfetto trace.

The report's attribution (``segments``, ``hops``) is declared here and made by
``omnitrace.analyze.report_tables`` from the report's walk.
"""
