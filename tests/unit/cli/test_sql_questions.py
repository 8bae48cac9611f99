"""The five questions of docs/sql.md, run as written there (`omnitrace sql`, in process),
give the report's own numbers on the golden synthetic run (tests/support/sql_questions.py
asks and checks; on a real run: tests/system/cli/test_sql_questions.py)."""
from __future__ import annotations


from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import load_run
from omnitrace.tables import schema  # noqa: F401 - pyarrow's import-time hooks at collection, not mid-test
from tests.support.sql_questions import ask_all


def test_the_questions_give_the_reports_numbers_on_the_synthetic_run(synthetic_run, capsys):
    answers = ask_all(capsys, synthetic_run, build_report(load_run([synthetic_run])))
    # each comparison had something to compare
    assert len(answers[0]) > 100 and len(answers[1]) == 2 and len(answers[2]) > 200 and len(answers[4]) == 4
