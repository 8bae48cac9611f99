"""The reference pipeline's server, started and checked as the tests use it."""
from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
import yaml
from omnitrace.runtime import config


SHM = "/dev/shm"


TAG = f"rtt{os.getpid()}"  # every request id of this module starts with it


def fast_pipeline(tmp_path, **overrides) -> str:
    """The packaged Qwen3-Omni shape with a fast cost model, for a small shared machine."""
    d = config.to_dict(config.load())
    for s in d["stages"]:
        s["cost"] = {"base_ms": 1.0, "per_prefill_token_us": 0.2, "per_seq_us": 10.0}
    d["limits"] = {"max_prompt_tokens": 4096, "max_tokens": 512}
    for k, v in overrides.items():
        d[k] = v
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_entries(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir(SHM) if n.startswith(prefix))


class Server:
    def __init__(self, pipeline: str, *args: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "omnitrace.cli.serve", "--port", str(self.port),
             "--pipeline", pipeline, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, **(env or {})))
        seen = ""
        for line in self.proc.stdout:  # "listening on ..." once every stage is ready
            seen += line
            if "listening on" in line:
                break
        else:
            raise AssertionError(f"server did not start: {seen}")
        self.stage_pids = [s["pid"] for s in self.health()[1]["stages"]]

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError("server did not stop within 30 s")
        return out


def assert_stopped_clean(srv: Server) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in srv.stage_pids):
        time.sleep(0.05)
    alive = [p for p in srv.stage_pids if os.path.exists(f"/proc/{p}")
             and "Z" not in open(f"/proc/{p}/stat").read().split()[2]]
    assert not alive, f"stage processes still alive: {alive}"
    while time.monotonic() < deadline and (shm_entries(TAG) or shm_entries(f"ortpool{srv.proc.pid}@")):
        time.sleep(0.05)  # a stage unlinks what it owns on its way out
    assert shm_entries(TAG) == [], "chunk segments left behind"
    assert shm_entries(f"ortpool{srv.proc.pid}@") == [], "pool segments left behind"


def chat_body(max_tokens: int, text: str = "hello omni world", **extra) -> bytes:
    body = {"model": "qwen3-omni", "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
            "temperature": 0.0, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "ignore_eos": True, "modalities": ["text", "audio"], **extra}
    return json.dumps(body).encode()


# --------------------------------------------------------------------------- the tests' client
def post(srv: Server, body: bytes, rid: str | None = None, timeout: float = 60) -> tuple[int, bytes, dict]:
    headers = {"Content-Type": "application/json"}
    if rid:
        headers["x-request-id"] = rid
    req = urllib.request.Request(srv.url + "/v1/chat/completions", body, headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def parse_sse(raw: bytes) -> list[dict | str]:
    """Split like vLLM's StreamedResponseHandler: blank-line messages, `data: ` prefix."""
    out: list[dict | str] = []
    for msg in raw.decode().split("\n\n"):
        msg = msg.strip()
        if not msg or msg.startswith(":"):
            continue
        assert msg.startswith("data: "), msg[:80]
        payload = msg[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def check_stream(events: list, rid: str, prompt_tokens: int, max_tokens: int) -> tuple[str, int, float]:
    """Validate what vLLM-Omni's bench client reads; returns (text, audio packets, seconds)."""
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("error" not in c for c in chunks), [c for c in chunks if "error" in c]
    text, completion, params, audio, seconds = "", 0, None, 0, 0.0
    for c in chunks:
        assert c["id"] == rid and c["object"] == "chat.completion.chunk"
        assert c["modality"] in ("text", "audio")  # top level, on every chunk
        u = c["usage"]  # on every chunk
        assert u["prompt_tokens"] == prompt_tokens and u["completion_tokens"] >= completion
        completion = u["completion_tokens"]
        content = c["choices"][0]["delta"]["content"]
        if c["modality"] == "text":
            text += content
        else:
            with wave.open(io.BytesIO(base64.b64decode(content)), "rb") as w:  # a complete WAV
                p = (w.getnchannels(), w.getsampwidth(), w.getframerate())
                assert params in (None, p)
                params = p
                assert w.getnframes() > 0
                seconds += w.getnframes() / w.getframerate()
            audio += 1
    assert completion == max_tokens  # exact output length (ignore_eos semantics)
    assert len(text.split()) == max_tokens
    assert audio >= 1 and params == (1, 2, 24000)
    return text, audio, seconds


def speech_body(tokens: int, text: str = "hello omni world", **extra) -> bytes:
    return json.dumps({"model": "qwen3-tts", "input": text, "max_new_tokens": tokens, **extra}).encode()


RAW = {"stream": True, "stream_format": "audio"}
