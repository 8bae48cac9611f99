"""The Grafana dashboards under dashboards/ as data: their panels, their Prometheus
queries with Grafana's variables substituted, and the vLLM-Omni-only panels."""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASH_DIR = os.path.join(ROOT, "dashboards")
GRAFANA_DIR = os.path.join(DASH_DIR, "grafana")
VLLM_OMNI_ROW = "vLLM-Omni's own metrics (only with --log-stats)"
VLLM_METRIC = re.compile(r"\bvllm(_omni)?:")

# What Grafana puts in place of its macros for a 1 s scrape interval and the last minutes;
# multi-value variables set to All become their allValue, ".*".
MACROS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}
ALL = ".*"


def dashboard_files() -> list[str]:
    return sorted(glob.glob(os.path.join(GRAFANA_DIR, "*.json")))


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def panels(dash: dict) -> list[tuple[str, dict]]:
    """Every panel with the title of the row it sits in ("" above the first row)."""
    out, row = [], ""
    for p in dash.get("panels", []):
        if p.get("type") == "row":
            row = p.get("title", "")
            out.extend((row, q) for q in p.get("panels", []))
        else:
            out.append((row, p))
    return out


def substitute(expr: str, variables: list[str]) -> str:
    for macro, value in MACROS.items():
        expr = expr.replace(macro, value)
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", ALL).replace("$" + name, ALL)
    return expr


@dataclass
class Query:
    dashboard: str
    panel: str
    ref: str
    expr: str  # variables substituted
    vllm_omni_only: bool
    exemplar: bool
    legend: str = ""


def prometheus_queries() -> list[Query]:
    """Every Prometheus target of every panel, as Grafana would send it."""
    out = []
    for path in dashboard_files():
        dash = load(path)
        names = [v["name"] for v in dash.get("templating", {}).get("list", [])]
        for row, p in panels(dash):
            for t in p.get("targets", []):
                if t.get("datasource", {}).get("type") != "prometheus":
                    continue
                out.append(Query(os.path.basename(path), p["title"], t["refId"],
                                 substitute(t["expr"], names), row == VLLM_OMNI_ROW,
                                 bool(t.get("exemplar")), t.get("legendFormat", "")))
    return out


def variable_queries() -> list[tuple[str, str, str, str | None]]:
    """(dashboard, variable, metric selector, label) of every label_values() variable, and
    (dashboard, variable, PromQL, None) of every query_result() one."""
    out = []
    for path in dashboard_files():
        dash = load(path)
        names = [v["name"] for v in dash.get("templating", {}).get("list", [])]
        for v in dash.get("templating", {}).get("list", []):
            if v["type"] != "query":
                continue
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q)
            r = re.fullmatch(r"query_result\((.+)\)", q)
            assert m or r, f"{path}: variable {v['name']}: not label_values(SELECTOR, LABEL) or query_result(Q): {q}"
            out.append((os.path.basename(path), v["name"], substitute((m or r).group(1), names),
                        m.group(2) if m else None))
    return out
