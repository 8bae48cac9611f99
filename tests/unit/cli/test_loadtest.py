"""`omnitrace loadtest`'s default run directory, in process: two in one second get two.
Real servers, real load, real reports: tests/system/cli/test_loadtest.py."""
from __future__ import annotations

import os


def test_two_loadtests_in_one_second_get_two_run_directories(tmp_path, monkeypatch):
    """Issue 41: the default run directory was named by the second alone."""
    from omnitrace.cli import loadtest
    monkeypatch.setenv("OMNITRACE_RUNS_DIR", str(tmp_path))
    monkeypatch.setattr(loadtest.time, "strftime", lambda fmt: "20260101-000000")
    dirs = [loadtest.config_from_args([])[0].run_dir for _ in range(3)]
    assert [os.path.basename(d) for d in dirs] == ["loadtest-20260101-000000", "loadtest-20260101-000000-2",
                                                   "loadtest-20260101-000000-3"]
    assert all(os.path.isdir(d) for d in dirs)
