"""The run directory's readers and writers (omnitrace/runfiles): what is written reads
back the same, and a file omnitrace did not write is one line naming the file and the
field, never a traceback."""
from __future__ import annotations

import json
import os

import orjson
import pytest

from omnitrace.runfiles import names, read
from omnitrace.runfiles.write import RunDir, mark_status, update_run

RUN = {"run_id": "r1", "status": "running", "exit_code": None, "started_unix_ns": 5}
AGENT = {"events_read": 10, "rings": [{"name": "ring-1", "pid": 7, "index": 0, "events_written": 10,
                                       "dropped": 0}]}
BENCH = {"levels": [{"concurrency": 2, "measured_window": {"start_unix_ns": 1, "end_unix_ns": 2}}],
         "requests": [{"id": "a", "concurrency": 2, "start_unix_ns": 1}], "args": {}}


def _write(d, name: str, doc) -> None:
    with open(os.path.join(d, name), "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))


def test_what_the_writer_writes_reads_back(tmp_path):
    d = str(tmp_path)
    rd = RunDir(d)
    try:
        assert rd.write_run(RUN) and rd.write_agent(AGENT)
        assert rd.write_processes([{"pid": 7, "role": "api"}, {"pid": 8, "role": "stage", "stage": 0}])
    finally:
        rd.close()
    _write(d, names.BENCH, BENCH)
    assert read.read(d, names.RUN) == RUN and read.read(d, names.AGENT) == AGENT
    assert read.read(d, names.BENCH) == BENCH
    assert [p["pid"] for p in read.read_processes(d)] == [7, 8]
    assert read.run_id(d) == "r1"
    assert not os.path.exists(names.path(d, names.RESERVE))  # given back on close


@pytest.mark.parametrize("name, doc, says", [
    (names.AGENT, {"rings": "x"}, "agent.json: 'rings' is a string, not a list (not a file omnitrace writes)"),
    (names.AGENT, {"rings": [{"dropped": "3"}]}, "agent.json: 'rings[0].dropped' is a string, not an integer"),
    (names.RUN, {"status": 1}, "run.json: 'status' is an integer, not a string"),
    (names.RUN, [1, 2], "run.json: a JSON list, not the object omnitrace writes"),
    (names.BENCH, {"requests": {}}, "bench.json: not an omnitrace bench file ('requests' is dict, not a list)"),
    (names.BENCH, {"levels": [{"concurrency": 1.5}]}, "bench.json: 'levels[0].concurrency' is a number"),
])
def test_a_field_of_the_wrong_type_is_one_line_naming_file_and_field(tmp_path, name, doc, says):
    _write(tmp_path, name, doc)
    with pytest.raises(read.RunFileError) as exc:
        read.read(str(tmp_path), name)
    assert str(exc.value).startswith(says) and "\n" not in str(exc.value)
    assert exc.value.name == name and not isinstance(exc.value, read.UnreadableFile)
    assert read.read_or_empty(str(tmp_path), name) == {}


def test_a_torn_file_is_unreadable_and_a_missing_one_unknown(tmp_path):
    d = str(tmp_path)
    assert read.read(d, names.RUN) is None and read.read_or_empty(d, names.RUN) == {}
    assert read.run_id(d) is None
    _write(d, names.RUN, '{"run_id": "r')
    with pytest.raises(read.UnreadableFile, match=r"^run.json: unreadable \(JSONDecodeError: "):
        read.read(d, names.RUN)


def test_processes_skip_bad_lines_and_say_a_torn_last_one(tmp_path):
    _write(tmp_path, names.PROCESSES, '{"pid": 1}\nnot json\n[3]\n{"pid": "x"}\n{"pid": 2}\n{"pid": 3, "ro')
    warnings: list[str] = []
    assert [p["pid"] for p in read.read_processes(str(tmp_path), warnings)] == [1, "x", 2]
    assert warnings == ["processes.jsonl: last line 6 is truncated (writer killed mid-write?); ignored"]
    assert read.read_processes(str(tmp_path / "none")) == []


def test_update_run_keeps_the_other_fields_and_their_order_and_leaves_no_tmp(tmp_path):
    d = str(tmp_path)
    _write(d, names.RUN, RUN)
    update_run(d, lambda meta: meta.update(shm_leftovers={"wake_dirs": ["w"]}))
    mark_status(d, "agent-killed", 137, rings_left=[])
    with open(names.path(d, names.RUN), "rb") as f:
        got = orjson.loads(f.read())
    assert list(got) == [*RUN, "shm_leftovers", "rings_left", "ended_unix_ns"]
    assert got["status"] == "agent-killed" and got["exit_code"] == 137 and got["run_id"] == "r1"
    assert sorted(os.listdir(d)) == [names.RUN]


def test_update_run_of_an_unreadable_run_json_starts_empty(tmp_path):
    _write(tmp_path, names.RUN, "{torn")
    update_run(str(tmp_path), lambda meta: meta.update(a=1))
    assert read.load_object(str(tmp_path), names.RUN) == {"a": 1}


def test_metrics_tail_is_the_last_messages_oldest_first(tmp_path):
    _write(tmp_path, names.METRICS, '{"n": 1}\n{"n": 2}\n[]\n{"n": 3}\n{"n"')
    assert read.last_metrics(str(tmp_path), 2) == [{"n": 2}, {"n": 3}]
    assert read.last_metrics(str(tmp_path / "none"), 2) == []


def test_profiles_index_reads_or_is_none(tmp_path):
    assert read.read_profiles_index(str(tmp_path)) is None
    os.makedirs(tmp_path / names.PROFILES)
    _write(tmp_path, names.PROFILES_INDEX, {"profiles": [], "missing": []})
    assert read.read_profiles_index(str(tmp_path)) == {"profiles": [], "missing": []}
    _write(tmp_path, names.PROFILES_INDEX, "[]")
    assert read.read_profiles_index(str(tmp_path)) is None


def test_only_the_run_directory_package_spells_its_file_names_into_paths():
    """A path made of a run-directory file's name (``os.path.join(d, "run.json")``, an
    ``open``) outside omnitrace/runfiles is a reader or writer beside the one package."""
    import ast

    from tests.support.sources import modules

    spelled = {names.RUN, names.AGENT, names.BENCH, names.PROCESSES, names.METRICS, names.SPANS}
    found = []
    for mod, path in modules().items():
        if mod.startswith("omnitrace.runfiles"):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        found += [f"{mod}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Call)
                  for arg in node.args if isinstance(arg, ast.Constant) and arg.value in spelled]
    assert found == []
