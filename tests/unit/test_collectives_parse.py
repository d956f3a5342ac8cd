"""Reading the collective smoke test's result line and NCCL's transport lines."""

from __future__ import annotations

import json

from fsdpctl.hostcheck.collectives import collectives_result
from fsdpctl.workload.collectives import parse_size

RESULT = {"backend": "nccl", "world_size": 16, "device": "cuda",
          "results": [{"op": "all_reduce", "bytes": 1 << 20, "seconds": 1e-4, "algbw_gbps": 10.5, "busbw_gbps": 19.7}]}


def test_result_line_and_nccl_transports():
    lines = [
        "[rank3]:gpu2:123:456 [3] NCCL INFO Channel 00/0 : 3[3] -> 11[3] [send] via NET/IB/0",
        "[rank3]:gpu2:123:456 [3] NCCL INFO Channel 01/0 : 2[2] -> 3[3] via P2P/IPC",
        f"[rank0]:fsdpctl.collectives: {json.dumps(RESULT)}",
    ]
    found = collectives_result(lines)
    assert found["results"][0]["busbw_gbps"] == 19.7
    assert found["transport"] == ["NET/IB", "P2P"]


def test_socket_transport_and_gloo():
    socket_run = collectives_result(["NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
                                     f"fsdpctl.collectives: {json.dumps(RESULT)}"])
    assert socket_run["transport"] == ["NET/Socket"]
    gloo = collectives_result([f"fsdpctl.collectives: {json.dumps({**RESULT, 'backend': 'gloo'})}"])
    assert gloo["transport"] == ["gloo/TCP"]
    assert collectives_result(["no result here"]) is None


def test_sizes():
    assert parse_size("1K") == 1024 and parse_size("16M") == 16 << 20 and parse_size("512") == 512
    for bad in ("", "0", "-1K", "1X"):
        try:
            parse_size(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")
