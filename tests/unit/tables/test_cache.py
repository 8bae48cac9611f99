"""A long run's tables kept beside it (omnitrace.tables.cache): read back only while the
files and code they were made from are the same, never kept for a short load or a run
still recording, and a directory that cannot take them changes nothing."""
from __future__ import annotations

import os
import shutil

import orjson
import pytest

from omnitrace.analyze import report_tables
from omnitrace.runfiles import names
from omnitrace.tables import cache
from omnitrace.tables import run as tables_run
from tests.support import golden_inputs as gi

WANTED = {"requests", "fifo_tasks", "segments"}


@pytest.fixture
def run(tmp_path) -> str:
    d = str(tmp_path / "hol")
    shutil.copytree(os.path.join(gi.RUNS, "hol"), d)
    return d


def _made(run: str) -> report_tables.Loaded:
    return report_tables.load(run, WANTED)


def test_tables_kept_read_back_equal_without_a_second_load(run, monkeypatch):
    monkeypatch.setattr(cache, "MIN_LOAD_S", 0.0)
    first = _made(run)
    assert set(os.listdir(os.path.join(run, names.TABLE_CACHE))) >= {f"{n}.parquet" for n in WANTED}

    def no_load(*a, **k):
        raise AssertionError("loaded again although kept")
    monkeypatch.setattr(tables_run, "load", no_load)
    again = _made(run)
    assert set(again.tables) == WANTED
    for name in WANTED:
        assert cache.materialize(again.tables[name]).equals(first.tables[name]), name
    assert again.notes == first.notes


def test_a_short_load_keeps_nothing(run):
    assert cache.MIN_LOAD_S > 1.0  # the golden run loads in milliseconds
    _made(run)
    assert not os.path.exists(os.path.join(run, names.TABLE_CACHE))


@pytest.mark.parametrize("change", ["source file", "code"])
def test_a_change_to_what_they_were_made_from_discards_them(run, monkeypatch, change):
    made = _made(run)
    assert cache.keep(run, made.tables, made.notes, cache.MIN_LOAD_S)
    assert set(cache.read_fresh(run, WANTED)[0]) == WANTED
    if change == "source file":
        with open(os.path.join(run, names.BENCH), "ab") as f:
            f.write(b" ")
    else:
        monkeypatch.setattr(cache, "_code_digest", "other code")
    assert cache.read_fresh(run, WANTED) == ({}, [])


def test_notes_are_kept_with_the_tables(run):
    made = _made(run)
    assert cache.keep(run, made.tables, ["the spans are built from part of the run: x"], 60.0)
    assert cache.read_fresh(run, {"requests"})[1] == ["the spans are built from part of the run: x"]


def test_a_run_still_recording_is_not_kept(run):
    path = os.path.join(run, names.RUN)
    with open(path, "rb") as f:
        doc = orjson.loads(f.read())
    with open(path, "wb") as f:
        f.write(orjson.dumps({**doc, "status": "running"}))
    made = _made(run)
    assert not cache.keep(run, made.tables, made.notes, 60.0)
    assert not os.path.exists(os.path.join(run, names.TABLE_CACHE))


def test_a_directory_that_cannot_take_them_changes_nothing(run):
    with open(os.path.join(run, names.TABLE_CACHE), "wb") as f:  # a file where the folder would go
        f.write(b"x")
    made = _made(run)
    assert not cache.keep(run, made.tables, made.notes, 60.0)
    assert cache.read_fresh(run, WANTED) == ({}, [])


QUERY = ("SELECT r.request, f.residence_ns, f.blocked_by FROM fifo_tasks f JOIN requests r USING (request_id) "
         "ORDER BY f.enqueue_ns, r.request")


def _answer(capsys, runs: list[str]) -> str:
    from omnitrace.cli import sql
    assert sql.main([*runs, QUERY, "--format", "json"]) == 0
    return capsys.readouterr().out


def test_sql_answers_the_same_from_kept_tables(run, monkeypatch, capsys):
    monkeypatch.setattr(cache, "MIN_LOAD_S", 0.0)
    made = _answer(capsys, [run])
    monkeypatch.setattr(tables_run, "load", lambda *a, **k: pytest.fail("loaded again although kept"))
    assert _answer(capsys, [run]) == made


def test_kept_tables_combine_with_another_runs(run, tmp_path, monkeypatch, capsys):
    other = str(tmp_path / "worked")
    shutil.copytree(os.path.join(gi.RUNS, "worked"), other)
    both = _answer(capsys, [other, run])
    monkeypatch.setattr(cache, "MIN_LOAD_S", 0.0)
    _answer(capsys, [run])  # kept now: read back as a dataset beside the other run's tables
    assert _answer(capsys, [other, run]) == both


def test_stale_tables_are_replaced_and_nothing_else_is_touched(run):
    made = _made(run)
    assert cache.keep(run, made.tables, made.notes, 60.0)
    d = os.path.join(run, names.TABLE_CACHE)
    with open(os.path.join(d, "mine.txt"), "w") as f:  # a user's file in the folder
        f.write("keep me")
    with open(os.path.join(run, names.BENCH), "ab") as f:
        f.write(b" ")
    assert cache.keep(run, {"requests": made.tables["requests"]}, [], 60.0)
    assert sorted(os.listdir(d)) == ["manifest.json", "mine.txt", "requests.parquet"]
    assert set(cache.read_fresh(run, WANTED)[0]) == {"requests"}


def test_a_long_runs_report_keeps_its_request_tables_for_sql(synthetic_run, tmp_path, monkeypatch):
    """The report's load makes the request tables too (their sink rides the same load):
    the first question about requests after a long run's report loads nothing, and its
    tables equal those a load of their own makes."""
    from omnitrace.analyze import rundir
    from omnitrace.analyze.report import build_report
    run = shutil.copytree(synthetic_run, str(tmp_path / "synthetic"))
    monkeypatch.setattr(cache, "MIN_LOAD_S", 0.0)
    monkeypatch.setattr(rundir, "KEEP_FOR_SQL_BYTES", 0)
    build_report(rundir.load_run([run]))
    kept, notes = cache.read_fresh(run, set(tables_run.ALONGSIDE))
    assert set(kept) == tables_run.ALONGSIDE
    kept = {name: cache.materialize(t) for name, t in kept.items()}
    shutil.rmtree(os.path.join(run, names.TABLE_CACHE))
    own = tables_run.load(run, tables_run.ALONGSIDE)
    assert min(own.tables[n].num_rows for n in ("requests", "stage_visits", "api_marks")) >= 300
    for name in tables_run.ALONGSIDE:
        assert kept[name].equals(own.tables[name]), name
    assert notes == report_tables.load(run, {"requests"}).notes

    def no_load(*a, **k):
        raise AssertionError("loaded again although kept")
    monkeypatch.setattr(tables_run, "load", no_load)  # a question about requests: none
    build_report(rundir.load_run([run]))
    report_tables.load_runs([run], {"requests", "stage_visits", "api_marks"})


def test_a_short_runs_report_keeps_nothing(run):
    from omnitrace.analyze import rundir
    from omnitrace.analyze.report import build_report
    build_report(rundir.load_run([run]))
    assert not os.path.exists(os.path.join(run, names.TABLE_CACHE))


def test_the_report_command_keeps_them_once_its_files_are_written(synthetic_run, tmp_path, monkeypatch, capsys):
    from omnitrace.analyze import rundir
    from omnitrace.cli import report as cli_report
    run = shutil.copytree(synthetic_run, str(tmp_path / "synthetic"))
    monkeypatch.setattr(cache, "MIN_LOAD_S", 0.0)
    monkeypatch.setattr(rundir, "KEEP_FOR_SQL_BYTES", 0)
    assert cli_report.main([run, "--json", str(tmp_path / "r.json")]) == 0
    assert os.path.getsize(tmp_path / "r.json") > 1000
    assert set(cache.read_fresh(run, set(tables_run.ALONGSIDE))[0]) == tables_run.ALONGSIDE
