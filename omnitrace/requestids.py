"""How vLLM-Omni names a served request, and the one rule that maps its names to omnitrace's.

A request has three names. The client's (``X-Request-Id``, or a uuid the route makes); the
route's, ``chatcmpl-<client id>`` (chat) or ``speech-<client id>`` (speech, under
omnitrace), the ``id`` of every SSE chunk; and the engine's, ``<route id>-<uuid:.8>``
(``AsyncOmni._get_unique_request_id``), the ``external_req_id`` every stage and connector
key carries. omnitrace records the client's, so a request is one trace from arrival to its
last chunk. The connector names a chunk's shared-memory segment ``<engine id>_<producer
stage>_<chunk>`` (ids may hold ``_``).

Pure string rules: the stage hooks (``patches/vllm_omni``) memoise them, the sweep after a
run (``inject/leftovers.py``) tells its own chunk segments from another server's by them.
"""
from __future__ import annotations

_HEX = frozenset("0123456789abcdef")
ROUTE_PREFIXES = ("chatcmpl-", "speech-")  # how the chat and speech routes name a request


def has_engine_suffix(rid: str) -> bool:
    """``rid`` ends in the engine's ``-<8 hex>``."""
    tail = rid[-9:]
    return len(rid) > 9 and tail[0] == "-" and _HEX.issuperset(tail[1:])


def route_request_id(route_id: str) -> str:
    """The route's ``chatcmpl-<X-Request-Id>`` / ``speech-<X-Request-Id>`` as the client
    named it (one prefix dropped)."""
    for prefix in ROUTE_PREFIXES:
        if route_id.startswith(prefix) and len(route_id) > len(prefix):
            return route_id[len(prefix):]
    return route_id


def recorded_id(engine_id: str) -> str:
    """The id omnitrace records for an engine id: the client's, both affixes dropped. Ids
    without them (the engine driven without the API server) are kept as they are."""
    rid = engine_id
    if has_engine_suffix(rid) and rid.startswith(ROUTE_PREFIXES):
        rid = rid[:-9]
    return route_request_id(rid)


def chunk_key(key: str) -> tuple[str, int, int]:
    """A connector key ``<engine id>_<stage>_<chunk>`` as (engine id, stage, chunk);
    ValueError for another form. No more checks than the split: the stage hooks parse every
    chunk's key with it, and vLLM-Omni's connector writes only this form."""
    eid, stage, chunk = key.rsplit("_", 2)
    return eid, int(stage), int(chunk)
