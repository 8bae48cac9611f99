"""spanload.py, the one loader, in process: a run without an event log has nothing to build.
The forked helper against the decoding done here: tests/system/test_spanload.py."""


from omnitrace import spanload
from omnitrace.analyze import tables
def test_a_run_without_an_event_log_has_nothing_to_build(tmp_path):
    assert spanload.load(str(tmp_path), [tables.ReportTables()], helper=True) is None
