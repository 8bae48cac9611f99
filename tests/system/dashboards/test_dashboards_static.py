"""The dashboards, provisioning and compose file, checked without a Grafana: Grafana's own
published types (npm @grafana/schema, type-checked with tsc), every query through
`promtool check rules`, the conventions (no datasource UIDs, $__rate_interval), and the
compose/provisioning wiring against omnitrace's defaults."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support.system_deps import need

from tests.support.dashboard_util import (DASH_DIR, GRAFANA_DIR, dashboard_files,
                                  load, panels, prometheus_queries)

SCHEMA_DIR = os.path.join(DASH_DIR, "schema-check")
TSC = os.path.join(SCHEMA_DIR, "node_modules", ".bin", "tsc")
PROMTOOL = shutil.which("promtool") or "promtool"
PROVISIONING = os.path.join(DASH_DIR, "provisioning")
COMPOSE = os.path.join(DASH_DIR, "compose.yaml")

# panel type -> (module under @grafana/schema's panel configs, its Options/FieldConfig names)
PANEL_CFG = {t: f"@grafana/schema/dist/esm/raw/composable/{t}/panelcfg/x/{n}PanelCfg_types.gen"
             for t, n in (("timeseries", "TimeSeries"), ("heatmap", "Heatmap"), ("bargauge", "BarGauge"),
                          ("text", "Text"), ("table", "Table"))}


def test_dashboards_are_generated_from_generate_py():
    r = subprocess.run([sys.executable, os.path.join(DASH_DIR, "generate.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [os.path.basename(p) for p in dashboard_files()] == ["omnitrace-overview.json",
                                                                 "omnitrace-request.json"]


def _ts_source(dashboards: list[tuple[str, dict]]) -> str:
    """A TypeScript module asserting, with `satisfies`, that each dashboard is a
    Dashboard, each panel a Panel (checked alone, so unknown keys are errors), and each
    panel's options and custom field config its panel type's generated types. JSON string
    literals stand for Grafana's string enums through Loose<T>."""
    lines = ["import type { Dashboard, Panel, RowPanel, VariableModel } from '@grafana/schema';"]
    for i, (t, mod) in enumerate(sorted(PANEL_CFG.items())):
        lines.append(f"import type * as P{i} from '{mod}';")
    lines.append("type Loose<T> = T extends string ? `${T}` : T extends number | boolean | null | undefined ? T"
                 " : T extends (infer U)[] ? Loose<U>[] : { [K in keyof T]: Loose<T[K]> };")
    mods = {t: f"P{i}" for i, (t, _) in enumerate(sorted(PANEL_CFG.items()))}
    for d, (name, dash) in enumerate(dashboards):
        lines.append(f"// {name}")
        lines.append(f"export const dash{d} = {json.dumps(dash)} satisfies Loose<Dashboard>;")
        for v, var in enumerate(dash["templating"]["list"]):
            lines.append(f"export const dash{d}_var{v} = {json.dumps(var)} satisfies Loose<VariableModel>;")
        for _, p in panels(dash):
            pid = f"dash{d}_panel{p['id']}"
            lines.append(f"export const {pid} = {json.dumps(p)} satisfies Loose<Panel>;")
            if p["type"] in mods:
                m = mods[p["type"]]
                lines.append(f"export const {pid}_options = {json.dumps(p['options'])} "
                             f"satisfies Loose<{m}.Options>;")
                custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom")
                if custom is not None:
                    lines.append(f"export const {pid}_custom = {json.dumps(custom)} "
                                 f"satisfies Loose<{m}.FieldConfig>;")
        for p in dash["panels"]:
            if p["type"] == "row":
                lines.append(f"export const dash{d}_row{p['id']} = {json.dumps(p)} satisfies Loose<RowPanel>;")
    return "\n".join(lines) + "\n"


def _tsc(tmp_path, dashboards: list[tuple[str, dict]]) -> subprocess.CompletedProcess:
    (tmp_path / "node_modules").symlink_to(os.path.join(SCHEMA_DIR, "node_modules"))
    (tmp_path / "check.ts").write_text(_ts_source(dashboards))
    (tmp_path / "tsconfig.json").write_text(json.dumps({"compilerOptions": {
        "strict": True, "noEmit": True, "module": "nodenext", "moduleResolution": "nodenext",
        "target": "es2022", "skipLibCheck": True}, "files": ["check.ts"]}))
    return subprocess.run([TSC, "-p", str(tmp_path / "tsconfig.json")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


@pytest.fixture
def needs_tsc_installed():
    """Grafana's types and tsc, pinned in dashboards/schema-check (scripts/test.sh runs npm ci)."""
    if not os.path.exists(TSC):
        pytest.fail("needs dashboards/schema-check/node_modules: run scripts/test.sh, or "
                    "npm ci --prefix dashboards/schema-check (npm from the Debian package npm)",
                    pytrace=False)


needs_tsc = pytest.mark.usefixtures("needs_tsc_installed")


@needs_tsc
def test_dashboards_satisfy_grafana_schema(tmp_path):
    dashes = [(os.path.basename(p), load(p)) for p in dashboard_files()]
    r = _tsc(tmp_path, dashes)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@needs_tsc
def test_schema_check_catches_a_broken_dashboard(tmp_path):
    """The check above can fail: a panel without its gridPos width, a legend placement
    Grafana does not know, and a key no panel has are each reported."""
    dash = load(dashboard_files()[0])
    ts = [p for _, p in panels(dash) if p["type"] == "timeseries"]
    del ts[0]["gridPos"]["w"]
    ts[1]["options"]["legend"]["placement"] = "middle"
    ts[2]["colour"] = "red"
    r = _tsc(tmp_path, [("broken", dash)])
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "'w'" in out and '"middle"' in out and "colour" in out, out[-3000:]


def test_every_query_passes_promtool(tmp_path):
    need("promtool", "prometheus")
    queries = prometheus_queries()
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dash:query_{i}", "expr": q.expr} for i, q in enumerate(queries)]}]}
    for q in queries:
        assert "$" not in q.expr, (q.panel, q.expr)
    f = tmp_path / "rules.yml"
    f.write_text(yaml.safe_dump(rules))
    r = subprocess.run([PROMTOOL, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(queries)} rules found" in r.stdout
    # and promtool does reject a broken one
    f.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "dash:bad", "expr": queries[0].expr[:-1]}]}]}))
    r = subprocess.run([PROMTOOL, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0


# --------------------------------------------------------------------------- compose + provisioning
def _yaml(path: str):
    with open(path) as f:
        return yaml.safe_load(f)


def _port(url: str) -> int:
    return urlsplit(url if "://" in url else f"http://{url}").port


def _published(service: dict) -> dict[int, int]:
    """container port -> host port."""
    out = {}
    for p in service.get("ports", []):
        host, _, cont = str(p).rpartition(":")
        out[int(cont.split("/")[0])] = int(host.rpartition(":")[2])
    return out


def test_compose_and_provisioning_agree_with_omnitrace_defaults(monkeypatch):
    from omnitrace.agent.config import AgentConfig
    from omnitrace.agent.export_otlp import make_exporter

    for k in list(os.environ):  # the exporters' own defaults, not this shell's settings
        if k.startswith("OTEL_EXPORTER_OTLP"):
            monkeypatch.delenv(k)

    compose = _yaml(COMPOSE)
    services = compose["services"]
    assert {"otel-collector", "jaeger", "tempo", "prometheus", "grafana"} <= set(services)
    # every file a service mounts exists, relative to the compose file
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert os.path.exists(os.path.join(DASH_DIR, src)), f"{name}: {src} missing"

    def mounted(service: str, target: str) -> str:
        for vol in services[service]["volumes"]:
            src, dst = vol.split(":")[:2]
            if dst == target:
                return os.path.join(DASH_DIR, src)
        raise AssertionError(f"{service} mounts nothing at {target}")

    # Prometheus scrapes the agent's default endpoint, with exemplar storage on
    prom = services["prometheus"]
    assert prom.get("network_mode") == "host"  # the agent binds 127.0.0.1 on the host
    features = {f for c in prom["command"] if c.startswith("--enable-feature=")
                for f in c.split("=", 1)[1].split(",")}
    assert {"exemplar-storage", "native-histograms"} <= features, prom["command"]
    cfg_flag = next(c for c in prom["command"] if c.startswith("--config.file="))
    prom_cfg_path = mounted("prometheus", cfg_flag.split("=", 1)[1])
    prom_cfg = _yaml(prom_cfg_path)
    targets = [t for job in prom_cfg["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    default_port = AgentConfig.__dataclass_fields__["prometheus_port"].default
    default_addr = AgentConfig.__dataclass_fields__["prometheus_addr"].default
    assert f"{default_addr}:{default_port}" in targets
    need("promtool", "prometheus")
    r = subprocess.run([PROMTOOL, "check", "config", prom_cfg_path], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    prom_port = _port(next(c for c in prom["command"] if c.startswith("--web.listen-address=")).split("=")[1])

    # the collector takes OTLP where omnitrace's exporters send by default (4317 gRPC, 4318 HTTP)
    grpc_exp, http_exp = make_exporter("otlp-grpc", None, None), make_exporter("otlp-http", None, None)
    try:
        default_ports = {_port(grpc_exp._endpoint), _port(http_exp._endpoint)}
    finally:
        grpc_exp.shutdown()
        http_exp.shutdown()
    assert default_ports == {4317, 4318}
    coll = services["otel-collector"]
    coll_cfg = _yaml(mounted("otel-collector", next(
        c for c in coll["command"] if c.startswith("--config=")).split("=", 1)[1]))
    protos = coll_cfg["receivers"]["otlp"]["protocols"]
    recv_ports = {_port(protos["grpc"]["endpoint"]), _port(protos["http"]["endpoint"])}
    pub = _published(coll)
    assert {pub[p] for p in recv_ports} == default_ports
    # ...and sends the traces on to Jaeger and Tempo, and the agent's OTLP metrics somewhere
    pipes = coll_cfg["service"]["pipelines"]
    assert set(pipes["traces"]["exporters"]) == {"otlp/jaeger", "otlp/tempo"}
    assert "metrics" in pipes
    for name in pipes["traces"]["exporters"]:
        host, port = coll_cfg["exporters"][name]["endpoint"].rsplit(":", 1)
        assert host in services
        if host == "tempo":
            tempo = _yaml(mounted("tempo", next(c for c in services["tempo"]["command"]
                                              if c.startswith("-config.file=")).split("=", 1)[1]))
            assert _port(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]) == int(port)
        else:
            assert int(port) == 4317  # Jaeger's OTLP gRPC receiver

    # Grafana: the datasources the dashboards name, the exemplar links, the dashboards folder
    graf = services["grafana"]
    assert graf.get("network_mode") == "host"
    ds_files = os.listdir(mounted("grafana", "/etc/grafana/provisioning") + "/datasources")
    ds = [d for f in ds_files for d in _yaml(os.path.join(PROVISIONING, "datasources", f))["datasources"]]
    by_type = {d["type"]: d for d in ds}
    assert set(by_type) == {"prometheus", "jaeger", "tempo"}
    assert by_type["prometheus"].get("isDefault") is True
    assert _port(by_type["prometheus"]["url"]) == prom_port
    assert _port(by_type["jaeger"]["url"]) == _published(services["jaeger"])[16686]
    assert _port(by_type["tempo"]["url"]) == _published(services["tempo"])[
        _yaml(mounted("tempo", "/etc/tempo.yaml"))["server"]["http_listen_port"]]
    assert len({d["uid"] for d in ds}) == len(ds)  # datasource uids are unique
    dests = by_type["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert {d["datasourceUid"] for d in dests if "datasourceUid" in d} == {by_type["jaeger"]["uid"],
                                                                          by_type["tempo"]["uid"]}
    assert all(d["name"] == "trace_id" for d in dests)  # the agent's exemplar label
    assert any("/d/omnitrace-request" in d.get("url", "") for d in dests)
    assert by_type["prometheus"]["jsonData"]["timeInterval"] == prom_cfg["global"]["scrape_interval"]
    providers = _yaml(os.path.join(PROVISIONING, "dashboards", "omnitrace.yaml"))["providers"]
    path = providers[0]["options"]["path"]
    host_dir = mounted("grafana", path)
    assert os.path.samefile(host_dir, GRAFANA_DIR)


def test_compose_runs_the_grafana_the_schema_is_checked_against():
    with open(COMPOSE) as f:
        image = yaml.safe_load(f)["services"]["grafana"]["image"]
    with open(os.path.join(SCHEMA_DIR, "package.json")) as f:
        schema = json.load(f)["devDependencies"]["@grafana/schema"]
    assert image == f"grafana/grafana:{schema}", (image, schema)


def test_no_omnitrace_legend_shows_a_bare_stage_number():
    """A stage in a legend is its name (``{{stage_name}}``, joined from
    omnitrace_stage_info), at most with its number beside it."""
    for q in prometheus_queries():
        if not q.vllm_omni_only and "{{stage}}" in q.legend:
            assert "{{stage_name}}" in q.legend, (q.dashboard, q.panel, q.legend)


def test_latency_quantile_panels_show_the_exact_mean():
    """Beside p50/p99 (interpolated within buckets) each quantile panel has the mean from
    the histogram's sum and count, which buckets do not blur."""
    by_panel: dict = {}
    for q in prometheus_queries():
        by_panel.setdefault((q.dashboard, q.panel), []).append(q)
    quantile_panels = [k for k, qs in by_panel.items() if any("histogram_quantile" in q.expr for q in qs)
                       and not qs[0].vllm_omni_only]
    assert len(quantile_panels) >= 6
    for k in quantile_panels:
        assert any("_sum" in q.expr and "_count" in q.expr and q.legend.endswith("mean") for q in by_panel[k]), k
