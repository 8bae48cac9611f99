"""How a served request's names map to the id omnitrace records (omnitrace.requestids), the
stage hooks' memoised form of it, and the connector's chunk key."""
from __future__ import annotations

import pytest

from omnitrace import requestids
from omnitrace.inject import leftovers
from omnitrace.patches.vllm_omni import wrappers


@pytest.mark.parametrize("engine_id,want", [
    ("speech-abc-1-0123abcd", "abc-1"),  # the engine's speech-<client id>-<8 hex>
    ("speech-0123456789abcdef-deadbeef", "0123456789abcdef"),  # no client id: the route's uuid
    ("chatcmpl-xyz-deadbeef", "xyz"),
    ("chatcmpl-mrv2_28104_1-00000001", "mrv2_28104_1"),  # ids may hold '_'
    ("speech-chatcmpl-x-deadbeef", "chatcmpl-x"),  # one prefix dropped, never two
    ("other-deadbeef", "other-deadbeef"),  # the engine driven without the API: kept as is
    ("chatcmpl-xyz-DEADBEEF", "xyz-DEADBEEF"),  # not the engine's suffix (uuid hex is lower case)
])
def test_engine_ids_reduce_to_the_clients(engine_id, want):
    assert requestids.recorded_id(engine_id) == want
    assert wrappers.api_request_id(engine_id) == want
    assert wrappers.api_request_id(engine_id) == want  # memoised: the same answer again


@pytest.mark.parametrize("route_id,want", [
    ("speech-abc-1", "abc-1"), ("speech-0123456789abcdef", "0123456789abcdef"), ("chatcmpl-xyz", "xyz"),
    ("speech-chatcmpl-x", "chatcmpl-x"), ("speech-", "speech-"),
])
def test_the_routes_own_id_reduces_the_same_way(route_id, want):
    """What the API hooks record (the route's id, before AsyncOmni's suffix) is what the
    stage hooks record from the engine's."""
    assert requestids.route_request_id(route_id) == want
    assert requestids.recorded_id(f"{route_id}-0123abcd") == want


@pytest.mark.parametrize("name,want", [
    ("chatcmpl-a_b-0123abcd_1_3", ("chatcmpl-a_b-0123abcd", 1, 3)),
    ("x_0_0", ("x", 0, 0)),
    ("a_b_c", None), ("a_1", None), ("psm_1234", None),
])
def test_chunk_keys(name, want):
    if want is not None:
        assert requestids.chunk_key(name) == want
        assert wrappers._chunk_key(name) == (wrappers.api_request_id(want[0]), want[1], want[2])
        assert leftovers.request_of(name) == leftovers.request_of(f"shm_{name}_lockfile.lock") == want[0]
    else:
        for parse in (requestids.chunk_key, wrappers._chunk_key):
            with pytest.raises(ValueError):
                parse(name)
        assert leftovers.request_of(name) is None
