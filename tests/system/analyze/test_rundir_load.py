"""The run-directory loader: the parallel parse equals the serial one; torn tails."""
from __future__ import annotations

from omnitrace.analyze import otlp_import, rundir
from omnitrace.analyze.run import Run
from omnitrace.rules.span import Span
from tests.support.otlp_fixture import line, three_stage_request, write_run


def _key(s: Span) -> tuple:
    return tuple(getattr(s, k) for k in s.__slots__)


def test_parallel_equals_serial(tmp_path, monkeypatch):
    d = write_run(str(tmp_path / "r"), [line(three_stage_request(f"r{i}", off=i * 2000)) for i in range(40)])
    path = f"{d}/spans.jsonl"
    with open(path, "a") as f:
        f.write(line(three_stage_request("torn"))[:300])
    serial = Run([d])
    rundir.load_spans(path, serial, "spans.jsonl", workers=1)
    monkeypatch.setattr(otlp_import, "PARALLEL_MIN_BYTES", 0)
    par = Run([d])
    rundir.load_spans(path, par, "spans.jsonl", skip={"r3"}, workers=3)
    assert serial.span_count == 40 * 28 and any("truncated" in w for w in serial.warnings)
    assert any("truncated" in w for w in par.warnings)
    assert sorted(map(_key, par.spans)) == sorted(_key(s) for s in serial.spans if s.rid != "r3")
    assert len(serial.early) > len(serial.spans)  # chunk spans are rows, not objects

    def rows(run: Run) -> list:
        return sorted((run.chunk_requests[r[7]], *r[:7], *r[8:16]) for r in run.early.tolist())
    assert rows(par) == [r for r in rows(serial) if r[0] != "r3"]
    assert par.skipped_spans == 28 and par.span_lines == serial.span_lines == 40
