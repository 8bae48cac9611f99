"""Perfetto's own trace processor loads `omnitrace export --perfetto` and counts the
slices the scripts made. Its binary (trace_processor_shell) is not a package: the
``perfetto`` package downloads it at first use, which a machine that reaches only the
package registries cannot (tests/unit/cli/test_sql_export.py decodes the same trace with the
package's protos and checks it by the trace processor's rules). Where the binary is (a
developer's machine that ran the package once, or ``PERFETTO_TRACE_PROCESSOR``), this runs."""
from __future__ import annotations

import glob
import os

import pytest

from omnitrace.cli import export as export_cli
from tests.support import golden_inputs as gi
from tests.support.perfetto_check import script_slices


def _binary() -> str | None:
    found = os.environ.get("PERFETTO_TRACE_PROCESSOR") or next(iter(sorted(glob.glob(os.path.expanduser(
        "~/.local/share/perfetto/prebuilts/trace_processor_shell-*")))), None)
    return found if found and os.access(found, os.X_OK) else None


@pytest.mark.skipif(_binary() is None, reason="no trace_processor_shell here (the perfetto package "
                                              "downloads it; set PERFETTO_TRACE_PROCESSOR)")
@pytest.mark.parametrize("name,script", [("hol", gi.hol_script), ("worked", gi.worked_script)])
def test_perfettos_trace_processor_counts_a_slice_per_span(tmp_path, name, script):
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    path = str(tmp_path / "t.pftrace")
    assert export_cli.main([os.path.join(gi.RUNS, name), "--perfetto", path]) == 0
    tp = TraceProcessor(trace=path, config=TraceProcessorConfig(bin_path=_binary()))
    try:
        got = {r.name: r.n for r in tp.query("SELECT name, count(*) AS n FROM slice GROUP BY name")}
        errors = [r.name for r in tp.query("SELECT name FROM stats WHERE severity = 'error' AND value > 0")]
    finally:
        tp.close()
    assert got == script_slices(script())
    assert errors == []
