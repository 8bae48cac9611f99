"""Stream one request from the reference pipeline and save its audio.

    omnitrace serve &                      # or: omnitrace run serve
    python examples/stream_client.py --max-tokens 40 --out answer.wav

Prints text as it streams, TTFT and time to first audio packet (TTFP), and writes the
audio packets (each a complete WAV) concatenated into one WAV file.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import time
import urllib.request
import wave


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--prompt", default="Tell me about omni models.")
    ap.add_argument("--prompt-tokens", type=int, help="explicit prompt length (load-test field)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--request-id")
    ap.add_argument("--out", default="answer.wav")
    args = ap.parse_args()
    body = {"messages": [{"role": "user", "content": args.prompt}], "max_tokens": args.max_tokens,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if args.prompt_tokens:
        body["omnitrace_prompt_tokens"] = args.prompt_tokens
    headers = {"Content-Type": "application/json"}
    if args.request_id:
        headers["x-request-id"] = args.request_id
    req = urllib.request.Request(args.url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    t0 = time.perf_counter()
    ttft = ttfp = None
    pcm, params = b"", None
    with urllib.request.urlopen(req) as resp:
        print(f"request id: {resp.headers['x-request-id']}")
        for line in resp:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise SystemExit(f"error: {chunk['error']['message']}")
            content = chunk["choices"][0]["delta"].get("content") or ""
            if chunk["modality"] == "text" and content:
                ttft = ttft or time.perf_counter() - t0
                print(content, end="", flush=True)
            elif chunk["modality"] == "audio":
                ttfp = ttfp or time.perf_counter() - t0
                with wave.open(io.BytesIO(base64.b64decode(content))) as w:
                    params = params or w.getparams()
                    pcm += w.readframes(w.getnframes())
    print(f"\nTTFT {ttft * 1e3:.1f} ms, TTFP {ttfp * 1e3:.1f} ms, total {(time.perf_counter() - t0) * 1e3:.1f} ms")
    with wave.open(args.out, "wb") as w:
        w.setparams(params)
        w.writeframes(pcm)
    print(f"audio: {len(pcm) // 2 / params.framerate:.2f} s -> {args.out}")


if __name__ == "__main__":
    main()
