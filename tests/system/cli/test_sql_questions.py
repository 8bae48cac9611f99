"""The five questions of docs/sql.md, run as written there (`omnitrace sql`, in process),
give the report's own numbers on a real run of the reference pipeline
(tests/support/sql_questions.py asks and checks; on the golden synthetic run:
tests/unit/cli/test_sql_questions.py)."""
from __future__ import annotations


from omnitrace.analyze.report import build_report
from omnitrace.analyze.rundir import load_run
from omnitrace.tables import schema  # noqa: F401 - pyarrow's import-time hooks at collection, not mid-test
from tests.support.sql_questions import ask_all


def test_the_questions_give_the_reports_numbers_on_a_real_run(real_run, capsys):
    answers = ask_all(capsys, real_run, build_report(load_run([real_run])))
    assert answers[1] and answers[3][0]["requests"] > 0 and answers[4]
