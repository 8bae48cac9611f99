"""Helpers shared by the agent tests: run `omnitrace run`, read the run directory."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_writer.py")


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "OMNITRACE_"))}
    env.update(extra)
    return env


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Signal a process and wait for it; kill it if it outlives ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def omnitrace_run(args: list[str], env: dict | None = None, timeout: float = 90,
                  **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnitrace", "run", *args],
                          env=env or clean_env(), capture_output=True, text=True,
                          timeout=timeout, **kw)


def attrs_of(span: dict) -> dict:
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        if "intValue" in v:
            out[a["key"]] = int(v["intValue"])
        elif "arrayValue" in v:
            out[a["key"]] = [list(x.values())[0] for x in v["arrayValue"].get("values", [])]
        else:
            out[a["key"]] = list(v.values())[0] if v else None
    return out


def read_spans(run_dir: str) -> list[dict]:
    """Every span of the run, rebuilt from its event log by `omnitrace export`."""
    out = os.path.join(run_dir, "..", os.path.basename(run_dir) + ".otlp.jsonl")
    r = subprocess.run([sys.executable, "-m", "omnitrace", "export", run_dir, "--otlp-json", out],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    spans = []
    with open(out) as f:
        for line in f:
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        s["attrs"] = attrs_of(s)
                        spans.append(s)
    return spans


def read_json(run_dir: str, name: str):
    with open(os.path.join(run_dir, name)) as f:
        return json.load(f)
