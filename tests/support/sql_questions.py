"""The five questions of docs/sql.md as `omnitrace sql` answers them, each answer checked
against the report's own numbers (tests/unit/cli/test_sql_questions.py on the golden
synthetic run, tests/system/cli/test_sql_questions.py on a real run)."""
from __future__ import annotations

import json
import math
import os
import re

from omnitrace.cli import sql as sql_cli
from tests.support import golden_inputs as gi


QUESTIONS = 5


def questions() -> list[str]:
    """The first five ```sql blocks of docs/sql.md, in order."""
    with open(os.path.join(gi.ROOT, "docs", "sql.md")) as f:
        blocks = re.findall(r"```sql\n(.*?)```", f.read(), re.S)
    assert len(blocks) >= QUESTIONS
    return blocks[:QUESTIONS]


def ask(capsys, run: str, query: str) -> list[dict]:
    assert sql_cli.main([run, query, "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def check_head_of_line(rep: dict, rows: list[dict]) -> None:
    assert rep["head_of_line_pairs"] == len(rep["head_of_line"])  # every pair is listed
    got = {(r["victim"], r["culprit"]): r for r in rows}
    assert set(got) == {(h["victim"], h["culprit"]) for h in rep["head_of_line"]}
    for h in rep["head_of_line"]:
        g = got[(h["victim"], h["culprit"])]
        assert close(g["chunk_time_ms"], h["chunk_time_sum_ms"]) and g["tasks"] == h["tasks"], h


def check_fifo(rep: dict, rows: list[dict]) -> None:
    assert len({(r["stage"], r["replica"]) for r in rows}) == len({r["stage"] for r in rows})  # one replica
    got = {r["stage"]: r for r in rows}
    assert set(got) == {f["stage_id"] for f in rep["fifo"]}
    for f in rep["fifo"]:
        g = got[f["stage_id"]]
        assert g["tasks"] == f["count"]
        assert all(close(g[a], f[b]) for a, b in (("p50_ms", "residence_p50_ms"), ("p99_ms", "residence_p99_ms"),
                                                  ("max_ms", "residence_max_ms"))), (g, f)


def check_snapshot(rep: dict, rows: list[dict]) -> None:
    want = {r["id"]: sum(v for k, v in r["categories_ms"].items() if k.endswith("/snapshot")) for r in rep["requests"]}
    want = {k: v for k, v in want.items() if v > 0}
    got = {r["request"]: r["snapshot_ms"] for r in rows}
    assert set(got) == set(want) and all(close(got[k], want[k]) for k in want)


def check_ttfp(rep: dict, rows: list[dict]) -> None:
    (g,) = rows
    s = rep["ttfp"]["server_ms"]
    assert g["requests"] == s["count"] == rep["window"]["attributed"]
    assert close(g["p50_ms"], s["p50"]) and close(g["p99_ms"], s["p99"])
    if rep["ttfp"]["client_ms"]["count"]:  # seconds in bench.json: ns-rounded in the table
        assert abs(g["client_p50_ms"] - rep["ttfp"]["client_ms"]["p50"]) < 1e-5


def check_transfer(rep: dict, rows: list[dict]) -> None:
    got = {(r["pair"], r["side"]): r for r in rows}
    assert len(got) == 2 * len(rep["transfer"])
    for t in rep["transfer"]:
        for side in ("put", "get"):
            g, w = got[(t["pair"], side)], t[side]
            assert g["chunks"] == w["count"] and close(g["p50_us"], w["p50_us"]) and close(g["p99_us"], w["p99_us"])
            assert close(g["mb_per_s"], w["bandwidth_mb_s"])


CHECKS = (check_head_of_line, check_fifo, check_snapshot, check_ttfp, check_transfer)


def ask_all(capsys, run: str, rep: dict) -> list[list[dict]]:
    """Each question's answer, checked against ``rep``; question 3 with its 1 ms threshold
    at 0, so that every request with critical-path snapshot time is compared."""
    qs = questions()
    assert "> 1e6" in qs[2]
    qs[2] = qs[2].replace("> 1e6", "> 0")
    answers = [ask(capsys, run, q) for q in qs]
    for check, rows in zip(CHECKS, answers):
        check(rep, rows)
    return answers
