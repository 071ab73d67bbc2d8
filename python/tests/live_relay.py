"""The client against a live `gabp-relay serve` in front of the simulated mod, with `sim/echo`
leased. Run by relay/tests/it/python_client.rs:

  live_relay.py --bridge-file FILE --data-dir DIR --relay BIN

It connects through the discovery file, lists and calls tools (an error answer, the lease kept
alive past its time to live), subscribes and checks contiguous seqs, checks that a tool's answer
never overtakes the events the mod sent before it, marks an episode, resumes after closing its
connection with no gap, and reads the session back with `gabp-relay export` and the package's
reader. Any failed check exits 1 naming it; the last stdout line is one JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gabp_relay
from gabp_relay import ErrorCode, Event, GabpError

BIG = 2**70 + 1  # beyond a double's precision: must come back exact
#: The last seq taken per channel, across calls of `take` and across the resume.
SEEN: dict[str, int] = {}


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"live_relay.py: {what}", file=sys.stderr, flush=True)
        sys.exit(1)


async def take(sub: gabp_relay.Subscription, channel: str, n: int,
               notices: list[Event]) -> list[Event]:
    """The next ``n`` events on ``channel``, checking that each seq follows the last one taken
    (``SEEN``); the relay's notices met on the way are kept in ``notices``."""
    got: list[Event] = []
    while len(got) < n:
        e = await sub.next(timeout=20)
        if e.is_notice:
            check(e.channel != "relay/dropped", f"a drop: {e.payload}")
            notices.append(e)
            continue
        if e.channel != channel:
            continue
        if channel in SEEN:
            check(e.seq == SEEN[channel] + 1, f"{channel}: seq {e.seq} after {SEEN[channel]}")
        SEEN[channel] = e.seq
        got.append(e)
    return got


def lease_changes(notices: list[Event]) -> list[str]:
    return [n.payload.get("change") for n in notices if n.channel == "relay/lease"]


async def live(bridge_file: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with gabp_relay.connect(bridge_file=bridge_file, name="py-agent") as c:
        check(c.session_id is not None, "the welcome names the session")
        check(c.relay.get("bridge", {}).get("role") == "control",
              f"the welcome's bridge: {c.relay.get('bridge')}")
        out["session"] = c.session_id

        names = [t.name for t in await c.list_tools()]
        check({"sim/echo", "sim/fail", "sim/emit"} <= set(names), f"tools: {names}")
        out["tools"] = names

        ticks = await c.subscribe(["world/tick"])
        notices: list[Event] = []

        # sim/echo is leased: refused until this bridge holds the lease.
        try:
            await c.call_tool("sim/echo", {"x": 1})
            check(False, "a leased tool answered without the lease")
        except GabpError as e:
            check(e.code == ErrorCode.LEASE_HELD, f"without the lease: {e}")
        async with c.holding_lease(ttl_ms=600) as lease:
            check(lease.held and lease.holder is not None, f"lease: {lease}")
            await asyncio.sleep(1.5)  # over twice its time to live: renewed meanwhile
            echoed = await c.call_tool("sim/echo", {"big": BIG, "text": "é→𝄞"})
            check(echoed == {"echo": {"big": BIG, "text": "é→𝄞"}}, f"echo: {echoed}")
        status = await c.status()
        check(status.get("lease") is None, f"released: {status.get('lease')}")
        check(status.get("route") == "r" and status.get("recording") is True,
              f"status: route {status.get('route')}, recording {status.get('recording')}")
        out["statusLabels"] = [b.get("label") for b in status.get("bridges", [])]

        try:
            await c.call_tool("sim/fail")
            check(False, "sim/fail succeeded")
        except GabpError as e:
            check(e.code == -32000 and "on purpose" in e.message, f"sim/fail: {e}")
        try:
            await c.replay("pause")
            check(False, "a live relay took relay/replay")
        except GabpError as e:
            check(e.code == -32601 and "live mod" in e.message, f"replay on a live relay: {e}")

        got = await take(ticks, "world/tick", 300, notices)
        while "released" not in lease_changes(notices):  # events taken meanwhile come first
            got += await take(ticks, "world/tick", 1, notices)
        changes = lease_changes(notices)
        check(changes[0] == "acquired" and changes[-1] == "released" and "renewed" in changes,
              f"lease notices: {changes}")
        out["ticks"] = [got[0].seq, got[-1].seq]

        # A tool's answer never overtakes the events the mod sent before it.
        chat = await c.subscribe(["chat/message"])
        emitted = await c.call_tool("sim/emit", {"count": 500, "channel": "chat/message"})
        check(emitted == {"emitted": 500}, f"emit: {emitted}")
        check(chat.pending >= 500, f"{chat.pending} events buffered when sim/emit answered")
        await take(chat, "chat/message", 500, notices)

        mark = await c.mark("episode-start", {"episode": 1, "big": BIG})
        check(mark.marked and mark.label == "episode-start", f"mark: {mark}")
        await c.mark("episode-end", {"episode": 1})

        # Resume: close, let events pass, come back from where this connection was.
        last = (await take(ticks, "world/tick", 1, notices))[0]
        point = c.resume_point
        check(point is not None and point.channels.get("world/tick") == c.last_seqs["world/tick"],
              f"resume point {point}")
        assert point is not None
        out["sample"] = {"seq": last.seq, "payload": last.payload}
    await asyncio.sleep(0.5)
    async with gabp_relay.connect(bridge_file=bridge_file, name="py-agent", resume=point) as c:
        check(c.relay.get("resume", {}).get("resumed") is True, f"resumed: {c.relay}")
        assert c.resumed is not None
        SEEN["world/tick"] = point.channels["world/tick"]  # the next one taken follows it
        after = await take(c.resumed, "world/tick", 200, [])
        out["resumed"] = [after[0].seq, after[-1].seq]
    return out


def read_back(relay: str, data_dir: str, bridge_file: str, out: dict[str, Any]) -> None:
    token = json.loads(Path(bridge_file).read_text())["token"]
    deadline = time.monotonic() + 20
    while True:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "session.jsonl"
            subprocess.run([relay, "export", "latest", "--data-dir", data_dir, "-o", str(path)],
                           check=True, capture_output=True)
            text = path.read_text()
            rows = list(gabp_relay.read_export(path))
        marks = [r for r in rows if r.kind == "mark"]
        if len(marks) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # the recorder commits in batches
    check(token not in text, "the token is in the export")
    check([m.label for m in marks] == ["episode-start", "episode-end"],
          f"marks: {[m.label for m in marks]}")
    check(marks[0].data == {"episode": 1, "big": BIG}, f"mark data: {marks[0].data}")
    check(all(r.session == out["session"] for r in rows), "one session")
    hellos = [r for r in rows if r.method == "session/hello" and r.dir == "bridge->relay"]
    check(len(hellos) == 2 and all(
        h.payload["clientInfo"] == {"name": "py-agent"}
        and h.payload["bridgeVersion"].startswith("gabp-relay-python/") for h in hellos),
        f"hellos: {[h.payload for h in hellos]}")
    ticks = [r for r in rows if r.kind == "event" and r.channel == "world/tick"]
    seqs = [r.relay_seq for r in ticks]
    check(seqs == list(range(len(seqs))), "the recording's world/tick seqs are contiguous")
    sample = out["sample"]
    recorded = next(r for r in ticks if r.relay_seq == sample["seq"])
    check(recorded.payload == sample["payload"], "the event received is the event recorded")
    refused = [r for r in rows if r.error_code == ErrorCode.LEASE_HELD]
    check(len(refused) == 1, "the leased call's refusal is recorded")
    # The same rows, streamed from the command by the package.
    streamed = sum(1 for _ in gabp_relay.export_rows("latest", "--data-dir", data_dir,
                                                     "--channel", "world/tick", binary=relay))
    check(streamed >= len(seqs), f"export_rows: {streamed} world/tick rows")
    out["exportRows"] = len(rows)
    out["markRows"] = len(marks)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bridge-file", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--relay", required=True)
    a = p.parse_args()
    out = asyncio.run(live(a.bridge_file))
    read_back(a.relay, a.data_dir, a.bridge_file, out)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
