"""Reference pipeline runtime: a faithful, lightweight model of vLLM-Omni's async-chunk path.

Start it with ``omnitrace serve`` (or ``python -m omnitrace.cli.serve``; under
instrumentation ``omnitrace run serve``). Options: ``--host`` (127.0.0.1), ``--port``
(8000), ``--pipeline FILE`` (default: the packaged Qwen3-Omni shape, a copy of
``examples/qwen3_omni.yaml``), ``--snapshot copy|recursive``, ``--shm per-chunk|pool``.

Processes and threads (as in vLLM-Omni)::

    API server (aiohttp)          stage process x N (multiprocessing spawn)
      POST /v1/chat/completions     scheduler thread: continuous batching, compute step,
      POST /v1/audio/speech           snapshot + enqueue per request per step
      GET /health, /v1/models
      control: mp queues  ------>   sender thread: ONE FIFO, processor, shm put
      outputs: mp queue   <------   receiver thread: polls {request}_{producer}_{chunk}
                                    stage i -> stage i+1 data: POSIX shared memory only

Request body (OpenAI chat, ``stream: true`` only): ``messages`` (string content or text
parts), ``max_tokens`` (exact number of text tokens, no early stop; default 64),
prompt length = whitespace tokens of all message texts, or an explicit integer
``omnitrace_prompt_tokens`` (alias ``prompt_tokens``) for load tests. ``x-request-id``
(1-128 of ``A-Za-z0-9._:-``) becomes the request id in every stage (it also names the shm
segments), else ``chatcmpl-<uuid hex>``. The SSE stream follows vLLM-Omni's
``openai-chat-omni``: top-level ``modality`` and ``usage`` on every chunk, text deltas and
audio chunks (each a complete base64 WAV, PCM16 mono) interleaved as they are produced,
then ``data: [DONE]``. Errors: 400 with ``{"error": {"message": ...}}`` for bad input,
409 for an id already in flight, 503 when busy or a stage died (``/health`` says which);
a stage death mid-stream ends the stream with an ``{"error": ...}`` chunk.
``POST /v1/audio/speech`` takes vLLM-Omni's speech request (``input``, ``max_new_tokens``,
``stream``/``stream_format``, ``response_format`` wav|pcm) and answers as its speech route
does (``routes.py``); its default id is ``speech-<uuid hex>``.

Hook sites (``omnitrace.conventions.Ev``; recording is a no-op unless
``OMNITRACE_RUN_ID`` is set): API -- REQUEST_ARRIVE/DISPATCH/FIRST_TEXT/FIRST_AUDIO/END,
STAGE_DIED; scheduler -- STAGE_ADD/SCHEDULE/FINISH/EMIT, STEP_BEGIN/END,
SNAPSHOT_BEGIN/END, FIFO_ENQUEUE, CHUNK_SCHEDULED; sender -- FIFO_DEQUEUE,
PROCESS_BEGIN/END, PUT_BEGIN/END; receiver -- GET_BEGIN/END, CHUNK_READY. Chunk index
semantics are documented in :mod:`omnitrace.runtime.transfer`.
"""
