"""spanload.py, the one loader: an event log decoded and prepared by a forked helper process
gives the same tables (and the same report) as one decoded here; a corrupt log is the same
one error either way; a helper that dies or fails is replaced by the decoding done here."""
import multiprocessing as mp
import os

import orjson
import pytest

from omnitrace import eventlog, spanload
from omnitrace import spantable as stt
from omnitrace.analyze import report, rundir, tables


def _build(path: str, skip: frozenset, helper: bool) -> tuple[spanload.Loaded, tables.ReportTables]:
    acc = tables.ReportTables(skip)
    return spanload.load(path, [acc], helper=helper), acc


def _account(built: tuple[spanload.Loaded, tables.ReportTables]) -> dict:
    """Everything a load gives the report, as comparable values (row order included)."""
    loaded, acc = built
    log = loaded.log
    spans, early, figures, busy = acc.finish(
        {int(r.get("pid", 0)): int(r.get("replica", 0)) for r in log.rings.values()})
    arrays = [spans.requests, spans.visits, early, spans.emits, *figures.tables(), figures.first_start]
    return {"tables": [a.tobytes() for a in arrays],
            "busy": sorted((k, tuple(c.tobytes() for c in cols)) for k, cols in busy.items()),
            "events": loaded.events, "died": loaded.died, "rings": log.rings,
            "steps": loaded.steps.tobytes(), "ring_kinds": loaded.ring_kinds.tobytes(),
            "requests": list(log.requests.strings), "warnings": log.warnings,
            "torn": log.torn_records, "rows": acc.rows, "skipped": acc.skipped,
            "spans": len(spans), "early": len(early)}


@pytest.fixture
def many_parts(monkeypatch):
    """Small parts and feeds: the helper sends many, each with the request ids and ring
    descriptions new in it."""
    monkeypatch.setattr(eventlog, "STREAM_EVENTS", 1000)
    monkeypatch.setattr(spanload, "FEED_EVENTS", 300)


def test_the_helper_gives_the_tables_decoding_here_gives(real_run, many_parts):
    bench = orjson.loads(open(os.path.join(real_run, "bench.json"), "rb").read())
    skip = frozenset(rundir._warmup_ids(bench))
    here = _build(real_run, skip, helper=False)
    beside = _build(real_run, skip, helper=True)
    want, got = _account(here), _account(beside)
    assert skip and want["skipped"] > 0  # warm-up spans were left out
    assert want["spans"] > 50 and want["early"] > 500 and want["events"] > 20 * 1000  # many parts
    assert want["busy"]  # the senders' busy intervals, from the helper's sender rule
    assert got == want
    assert not mp.active_children()  # the helper was waited for


def test_the_report_is_the_same_with_the_helper(real_run, monkeypatch):
    here = report.build_report(rundir.load_run([real_run]), waterfalls=3)
    monkeypatch.setattr(spanload, "HELPER_MIN_BYTES", 0)  # this small log: by the helper
    assert spanload.helper_pays(real_run)
    beside = report.build_report(rundir.load_run([real_run]), waterfalls=3)
    assert here["window"]["attributed"] >= 10
    assert orjson.dumps(beside) == orjson.dumps(here)


def test_a_corrupt_log_is_the_same_one_error_from_the_helper(real_run, tmp_path):
    d = tmp_path / "run"
    os.makedirs(d / eventlog.DIR)
    segments = eventlog.segments(real_run)
    for src in segments:
        data = open(src, "rb").read()
        if src == segments[-1]:
            data = data[:10] + b"\xff" * 30 + data[40:]
        (d / eventlog.DIR / os.path.basename(src)).write_bytes(data)
    errors = []
    for helper in (False, True):
        with pytest.raises(eventlog.EventLogError, match="corrupt event segment") as exc:
            _build(str(d), frozenset(), helper=helper)
        errors.append(str(exc.value))
    assert errors[0] == errors[1]
    assert not mp.active_children()


@pytest.mark.parametrize("how", ["dies", "raises"])
def test_a_helper_that_dies_or_fails_is_replaced_by_decoding_here(real_run, many_parts,
                                                                  monkeypatch, how):
    parent = os.getpid()
    arrays = stt.Prepared.arrays

    def broken(self):  # called in the helper only
        if os.getpid() != parent:
            if how == "dies":
                os._exit(9)  # killed, out of memory: nothing more on the pipe
            raise MemoryError("no memory for the feed")
        return arrays(self)

    monkeypatch.setattr(stt.Prepared, "arrays", broken)
    want = _account(_build(real_run, frozenset(), helper=False))
    assert _account(_build(real_run, frozenset(), helper=True)) == want
    assert not mp.active_children()


def _index_bytes(index) -> list[bytes]:
    return [index.spans.tobytes(), index.busy.tobytes(), index.steps.tobytes(),
            repr(sorted(index.threads.kind.items())).encode()]


def _otlp_rows(spans: list) -> list[tuple]:
    return [(s.name, s.trace_id, s.span_id, s.parent_id, s.start, s.end, sorted(map(str, s.attrs.items())))
            for s in spans]


def test_sinks_of_one_load_get_what_each_gets_alone(real_run, many_parts):
    """The report's tables, the flame index and the export's spans taken from one load
    (by the helper) equal each taken alone (decoded here)."""
    from omnitrace.cli.export import OtlpSink
    from omnitrace.profile.linked import IndexSink

    acc, index, spans = tables.ReportTables(), IndexSink(), []
    loaded = spanload.load(real_run, [acc, index, OtlpSink("run", spans.extend)], helper=True)
    want_acc = _build(real_run, frozenset(), helper=False)
    want_index = IndexSink()
    want_index_of = spanload.load(real_run, [want_index], helper=False)
    want_spans: list = []
    spanload.load(real_run, [OtlpSink("run", want_spans.extend)], helper=False)

    # with the export's sink the builder ranks blocked_by, which the tables' rows carry
    # and the report never reads: the rows are compared without it; the steps and events
    # per (ring, kind) are collected for the index only
    got = _account((loaded, acc))
    assert len(got.pop("steps")) and len(got.pop("ring_kinds"))
    want = _account(want_acc)
    assert not want.pop("steps") and not want.pop("ring_kinds")
    assert got == want
    assert _index_bytes(index.index(loaded)) == _index_bytes(want_index.index(want_index_of))
    assert len(spans) > 1000 and _otlp_rows(spans) == _otlp_rows(want_spans)
    assert any(s.attrs.get("omni.fifo.blocked_by") for s in spans)  # culprits ranked for the export


REQUEST_TABLES = {"requests", "stage_visits", "emits", "api_marks"}


class _Names:
    """A sink that reads no chunk spans and notes the span names it was fed."""

    chunks = False

    def __init__(self) -> None:
        self.names: set[int] = set()

    def feed(self, feed: stt.Feed, part: spanload.Part) -> None:
        self.names |= set(feed.spans.slices()["name"].tolist())


@pytest.mark.parametrize("helper", [False, True])
def test_a_load_for_request_tables_pairs_no_chunks_and_gives_the_same_tables(real_run, many_parts, helper):
    from omnitrace.tables.build import TablesSink

    def tables_of(sink, helper: bool) -> dict:
        loaded = spanload.load(real_run, [sink], helper=helper)
        return sink.finish(loaded.log.rings, list(loaded.log.requests.strings))

    names, sink = _Names(), TablesSink(REQUEST_TABLES)
    assert not sink.chunks and TablesSink({"requests", "fifo_tasks"}).chunks
    got = tables_of(sink, helper)
    spanload.load(real_run, [names, TablesSink(REQUEST_TABLES)], helper=helper)
    assert names.names == {stt.N_REQUEST, stt.N_STAGE, stt.N_QUEUE}  # no chunk span was built
    want = tables_of(TablesSink(), helper=False)
    assert got.keys() == REQUEST_TABLES and got["requests"].num_rows > 10
    for name in REQUEST_TABLES:
        assert got[name].equals(want[name]), name
    # without the emits table, each visit's packets are summed feed by feed: the same visits
    alone = tables_of(TablesSink({"stage_visits", "api_marks"}), helper)
    assert alone["stage_visits"].equals(want["stage_visits"]) and alone["api_marks"].equals(want["api_marks"])
