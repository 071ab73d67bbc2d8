"""Drives gabp-relay's MCP front with the official MCP Python SDK (`mcp` from PyPI).

Run by relay/tests/it/mcp.rs. Usage:
  client.py scenario stdio NAME -- CMD ARGS...   the functional scenario over stdio
  client.py scenario http NAME URL               the same over Streamable HTTP (token in GABP_TOKEN)
  client.py bench stdio NAME -- CMD ARGS...      latency and events_poll throughput
  client.py bench http NAME URL
The scenario prints `RESTART` on stdout when it is ready for the mod to restart and then waits
for `notifications/tools/list_changed`. The last stdout line is one JSON document (the result);
any failed check exits 1 with the reason on stderr.
"""

import json
import os
import sys
import time

import anyio
import mcp.types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def fail(msg):
    print(f"client.py: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def payload(result):
    """The JSON a tool result carries as text."""
    check(result.content and result.content[0].type == "text", f"no text content: {result}")
    return json.loads(result.content[0].text)


class Notices:
    def __init__(self):
        self.tools_changed = anyio.Event()

    async def __call__(self, message):
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed.set()


def transport(mode, rest):
    if mode == "stdio":
        check(rest and rest[0] == "--", "stdio needs -- CMD ARGS")
        params = StdioServerParameters(command=rest[1], args=rest[2:], env=dict(os.environ))
        return stdio_client(params)
    token = os.environ["GABP_TOKEN"]
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return streamable_http_client(rest[0], http_client=http)


async def poll_until(session, channel, count, cursor=None, sess=None, max_per_poll=1000):
    """Polls `channel` until `count` events arrived; checks seq is contiguous; returns the seqs."""
    seqs = []
    deadline = time.monotonic() + 60
    while len(seqs) < count:
        check(time.monotonic() < deadline, f"only {len(seqs)} of {count} events on {channel}")
        args = {"channels": [channel], "max": max_per_poll, "waitMs": 1000}
        if cursor is not None:
            args["cursor"] = cursor
            args["session"] = sess
        r = await session.call_tool("events_poll", args)
        check(not r.is_error, f"events_poll failed: {r}")
        p = payload(r)
        check(not p["missed"], f"events were missed: {p['missed']}")
        for e in p["events"]:
            check(e["channel"] == channel, f"event from another channel: {e['channel']}")
            if seqs:
                check(e["seq"] == seqs[-1] + 1, f"seq gap: {seqs[-1]} then {e['seq']}")
            seqs.append(e["seq"])
        cursor, sess = p["cursor"], p["session"]
    return seqs, cursor, sess


async def scenario(session, notices, name):
    out = {"name": name}
    init = await session.initialize()
    out["server"] = init.server_info.name
    out["protocol"] = init.protocol_version
    tools = {t.name: t for t in (await session.list_tools()).tools}
    out["tools"] = sorted(tools)
    for want in ["sim_echo", "sim_fail", "sim_emit", "events_poll", "attention_get", "attention_ack", "relay_status", "sessions_list", "relay_lease", "mark"]:
        check(want in tools, f"tool {want} missing from {sorted(tools)}")
    check(tools["sim_echo"].input_schema.get("type") == "object", "input schema not passed through")

    r = await session.call_tool("sim_echo", {"hello": name})
    check(not r.is_error, f"sim_echo failed: {r}")
    check(r.structured_content == {"echo": {"hello": name}}, f"sim_echo answered {r.structured_content}")
    out["echo"] = r.structured_content

    r = await session.call_tool("sim_fail", {})
    check(r.is_error, "sim_fail did not come back as isError")
    out["failText"] = r.content[0].text

    # Events: remember where the channel is now, make the mod emit, read them all in order.
    # Catch up with what is buffered (another client may have emitted already), then make the
    # mod emit and read on from there: other clients' emits interleave, seq stays contiguous.
    p = payload(await session.call_tool("events_poll", {"channels": ["chat/message"], "max": 5000}))
    check(not p["more"], "more than 5000 events buffered before the test emitted any")
    cursor, sess = p["cursor"], p["session"]
    start = cursor.get("chat/message")
    r = await session.call_tool("sim_emit", {"count": 500, "channel": "chat/message"})
    check(not r.is_error, f"sim_emit failed: {r}")
    seqs, cursor, sess = await poll_until(session, "chat/message", 500, cursor, sess, 128)
    check(start is None or seqs[0] == start, f"the first event read has seq {seqs[0]}, not {start}")
    out["events"] = {"count": len(seqs), "first": seqs[0], "last": seqs[-1]}

    r = await session.call_tool("attention_get", {})
    check(not r.is_error, f"attention_get failed: {r}")
    out["attention"] = payload(r)
    r = await session.call_tool("attention_ack", {"attentionId": "attn_1"})
    check(not r.is_error, f"attention_ack failed: {r}")
    out["ack"] = payload(r)

    r = await session.call_tool("mark", {"label": f"episode-start-{name}", "data": {"episode": 1}})
    check(not r.is_error, f"mark failed: {r}")
    check(payload(r).get("marked") is True, f"mark answered {payload(r)}")
    r = await session.call_tool("mark", {"data": 1})
    check(r.is_error, "a mark without a label did not come back as isError")

    status = payload(await session.call_tool("relay_status", {}))
    out["bridgesSeen"] = len(status["bridges"])
    out["sessions"] = payload(await session.call_tool("sessions_list", {}))

    resources = [str(r.uri) for r in (await session.list_resources()).resources]
    out["resources"] = resources
    chan = [u for u in resources if u.endswith("/channels/chat/message")]
    check(chan, f"no channel resource in {resources}")
    read = await session.read_resource(chan[0])
    latest = json.loads(read.contents[0].text)
    check(latest["events"], "channel resource holds no events")
    welcome = json.loads((await session.read_resource([u for u in resources if u.endswith("/welcome")][0])).contents[0].text)
    check(welcome["app"]["name"], "welcome resource has no app")

    # The mod restarts: the tool list is re-announced, and tools work in the new session.
    print("RESTART", flush=True)
    with anyio.fail_after(30):
        await notices.tools_changed.wait()
    out["listChanged"] = True
    tools = {t.name for t in (await session.list_tools()).tools}
    check("sim_echo" in tools, "sim_echo gone after the restart")
    r = await session.call_tool("sim_echo", {"after": "restart"})
    check(not r.is_error and r.structured_content == {"echo": {"after": "restart"}}, f"after restart: {r}")
    return out


def percentiles(lat):
    lat = sorted(lat)
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3
    return {"p50Ms": round(pick(0.50), 3), "p99Ms": round(pick(0.99), 3), "n": len(lat)}


async def bench(session, name):
    await session.initialize()
    await session.list_tools()
    out = {"name": name}
    n = int(os.environ.get("BENCH_CALLS", "500"))
    if n > 0:
        # 100 calls/s open loop: latency from each call's scheduled time.
        lat = []
        t0 = time.perf_counter()

        async def one(i):
            due = t0 + i / 100.0
            await anyio.sleep(max(0.0, due - time.perf_counter()))
            r = await session.call_tool("sim_echo", {"i": i})
            check(not r.is_error, "sim_echo failed")
            lat.append(time.perf_counter() - due)

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        out["rate100"] = percentiles(lat)
        # Concurrency 8, closed loop.
        lat, stop = [], time.perf_counter() + float(os.environ.get("BENCH_SECONDS", "5"))

        async def worker():
            while time.perf_counter() < stop:
                s = time.perf_counter()
                r = await session.call_tool("sim_echo", {"c": 8})
                check(not r.is_error, "sim_echo failed")
                lat.append(time.perf_counter() - s)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(worker)
        out["conc8"] = percentiles(lat)
        out["conc8"]["callsPerS"] = round(len(lat) / float(os.environ.get("BENCH_SECONDS", "5")), 1)
    # events_poll against the mod's stream: every event of every channel, contiguous per channel.
    secs = float(os.environ.get("BENCH_EVENTS_SECONDS", "0"))
    if secs > 0:
        p = payload(await session.call_tool("events_poll", {"max": 1}))
        cursor, sess = p["cursor"], p["session"]
        last, count, missed = {}, 0, 0
        t_start = time.perf_counter()
        while time.perf_counter() - t_start < secs:
            r = await session.call_tool("events_poll", {"cursor": cursor, "session": sess, "max": 5000, "waitMs": 1000})
            p = payload(r)
            missed += sum(m["toSeq"] - m["fromSeq"] + 1 for m in p["missed"])
            for e in p["events"]:
                c = e["channel"]
                if c in last:
                    check(e["seq"] == last[c] + 1 or p["missed"], f"seq gap on {c}: {last[c]} then {e['seq']}")
                last[c] = e["seq"]
            count += len(p["events"])
            cursor, sess = p["cursor"], p["session"]
        el = time.perf_counter() - t_start
        out["events"] = {"perS": round(count / el), "count": count, "missed": missed, "seconds": round(el, 2)}
    return out


async def main():
    if len(sys.argv) < 4:
        fail(__doc__)
    what, mode, name, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    notices = Notices()
    async with transport(mode, rest) as (read, write):
        info = types.Implementation(name=name, version="1.0")
        async with ClientSession(read, write, message_handler=notices, client_info=info) as session:
            if what == "scenario":
                out = await scenario(session, notices, name)
            else:
                out = await bench(session, name)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    anyio.run(main)
