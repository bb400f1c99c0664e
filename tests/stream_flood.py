"""An attacker with the client token: thousands of streams that send HTTP/2 HEADERS and
never a message (used by tests/test_starvation.py, run as its own process).

    python stream_flood.py MASTER WORKER TOKEN SESSIONS CALLS WRITES HOLD_SECONDS

opens that many header-only Session and Calls streams to the master and WriteBlock
streams to the worker, spread over 16 connections each, keeps them open for
HOLD_SECONDS (bounded: at most 10 minutes), cancels them and prints one JSON line:
per method, how many were still open at the end and how many the server had ended
(by status code).
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys

import grpc

CONNECTIONS = 16


async def flood(master: str, worker: str, token: str, counts: dict[str, int],
                hold: float) -> dict:
    metadata = (("authorization", "Bearer " + token),)
    targets = {"Session": (master, "stream_stream", "/curvine.Master/Session"),
               "Calls": (master, "stream_stream", "/curvine.Master/Calls"),
               "WriteBlock": (worker, "stream_unary", "/curvine.Worker/WriteBlock")}
    channels = {}
    calls: dict[str, list] = collections.defaultdict(list)
    for method, n in counts.items():
        address, shape, path = targets[method]
        for i in range(n):
            key = (address, i % CONNECTIONS)
            ch = channels.get(key)
            if ch is None:
                ch = channels[key] = grpc.aio.insecure_channel(address, options=[
                    ("grpc.use_local_subchannel_pool", 1)])  # a connection of its own
            calls[method].append(getattr(ch, shape)(path)(metadata=metadata))
        await asyncio.sleep(0)
    await asyncio.sleep(min(hold, 600.0))
    result = {}
    for method, started in calls.items():
        ended = collections.Counter()
        for call in started:
            if call.done():
                try:
                    ended[(await call.code()).name] += 1
                except Exception as e:  # noqa: BLE001 - whatever it was, it ended
                    ended[type(e).__name__] += 1
            call.cancel()
        result[method] = {"open": len(started) - sum(ended.values()), "ended": dict(ended)}
    for ch in channels.values():
        await ch.close()
    return result


def main(argv: list[str]) -> int:
    master, worker, token, sessions, calls, writes, hold = argv
    counts = {"Session": int(sessions), "Calls": int(calls), "WriteBlock": int(writes)}
    result = asyncio.run(flood(master, worker, token, counts, float(hold)))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
