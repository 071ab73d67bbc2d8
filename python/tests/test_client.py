"""The client against a scripted relay on loopback: framing byte for byte, the hello, requests
answered out of order, errors, events in order (also those ahead of a subscribe's answer), the
client's own bounded buffer, resume, a new session's seqs, a lost connection, broken framing,
the lease kept alive, the discovery file. Standard library only:
``python -m unittest discover -s python/tests``.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import unittest
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import gabp_relay
from gabp_relay import framing

TOKEN = "0123456789abcdef0123456789abcdef"
SESSION = "019ad2f0-0000-7000-8000-000000000001"

Send = Callable[[bytes], Awaitable[None]]
Handler = Callable[[dict[str, Any], Send], Awaitable[None]]


def answer(msg: dict[str, Any], result: Any) -> bytes:
    return framing.frame(framing.encode_body(
        {"v": "gabp/1", "id": msg["id"], "type": "response", "result": result}))


def error(msg: dict[str, Any], code: int, text: str, data: Any = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": text}
    if data is not None:
        err["data"] = data
    return framing.frame(framing.encode_body(
        {"v": "gabp/1", "id": msg["id"], "type": "response", "error": err}))


def event(channel: str, seq: int, payload: Any) -> bytes:
    return framing.frame(framing.encode_body(
        {"v": "gabp/1", "id": str(uuid.uuid4()), "type": "event", "channel": channel,
         "seq": seq, "payload": payload}))


def welcome(session: str = SESSION, **extra: Any) -> dict[str, Any]:
    relay = {"name": "gabp-relay", "sessionId": session, "maxBodyBytes": 4096, **extra}
    return {"agentId": "fake", "capabilities": {"extensions": {"relay": relay}}}


class FakeRelay:
    """A loopback server that welcomes a hello and hands every other request to ``handler``."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.handler = handler
        self.hellos: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.welcome = welcome()
        self.server: asyncio.AbstractServer | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)

        async def send(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        try:
            while True:
                body = await framing.read_body(reader, 1 << 20)
                if body is None:
                    return
                msg = json.loads(body)
                if msg["method"] == "session/hello":
                    self.hellos.append(msg)
                    await send(answer(msg, self.welcome))
                    continue
                self.requests.append(msg)
                if self.handler is not None:
                    await self.handler(msg, send)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


class ClientTest(unittest.IsolatedAsyncioTestCase):
    async def relay(self, handler: Handler | None = None) -> tuple[FakeRelay, str]:
        fake = FakeRelay(handler)
        addr = await fake.start()
        self.addAsyncCleanup(fake.stop)
        return fake, addr

    def test_frames_count_bytes_and_escape_to_ascii(self) -> None:
        body = framing.encode_body({"s": "é→", "n": 12345678901234567890})
        self.assertEqual(body, b'{"s":"\\u00e9\\u2192","n":12345678901234567890}')
        self.assertTrue(framing.frame(body).startswith(b"Content-Length: %d\r\n" % len(body)))
        self.assertEqual(framing.content_length(b"content-TYPE: x\r\nCONTENT-LENGTH: 7"), 7)
        with self.assertRaises(ValueError):
            framing.encode_body({"x": float("nan")})

    async def test_reads_utf8_bodies_by_their_byte_length(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            # Raw UTF-8 (not escaped), header names in odd case, two frames in one write.
            payloads = ["héllo → wörld", "𝄞" * 3]
            data = b""
            for seq, p in enumerate(payloads):
                body = json.dumps({"v": "gabp/1", "id": str(uuid.uuid4()), "type": "event",
                                   "channel": "chat/message", "seq": seq, "payload": p},
                                  ensure_ascii=False).encode()
                data += b"content-length: %d\r\nCONTENT-TYPE: application/json\r\n\r\n" % len(body)
                data += body
            await send(data + answer(msg, {"subscribed": msg["params"]["channels"]}))

        _, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            sub = await c.subscribe(["chat/message"])
            got = [await sub.next(5) for _ in range(2)]
        self.assertEqual([e.payload for e in got], ["héllo → wörld", "𝄞𝄞𝄞"])
        self.assertEqual([e.seq for e in got], [0, 1])

    async def test_hello_says_who_and_reads_the_welcome(self) -> None:
        fake, addr = await self.relay()
        async with gabp_relay.connect(addr, token=TOKEN, name="agent-7") as c:
            self.assertEqual(c.session_id, SESSION)
            self.assertEqual(c.max_body, 4096)
            self.assertEqual(c.relay["name"], "gabp-relay")
        (hello,) = fake.hellos
        self.assertEqual(hello["v"], "gabp/1")
        self.assertEqual(hello["type"], "request")
        uuid.UUID(hello["id"])
        p = hello["params"]
        self.assertEqual(p["token"], TOKEN)
        self.assertTrue(p["bridgeVersion"].startswith("gabp-relay-python/"))
        self.assertIn(p["platform"], ("linux", "macos", "windows"))
        uuid.UUID(p["launchId"])
        self.assertEqual(p["clientInfo"], {"name": "agent-7"})
        self.assertNotIn("relay", p)

    async def test_requests_are_answered_out_of_order(self) -> None:
        held: list[dict[str, Any]] = []

        async def handler(msg: dict[str, Any], send: Send) -> None:
            held.append(msg)
            if len(held) == 3:
                for m in reversed(held):
                    await send(answer(m, {"echo": m["params"]["arguments"]}))

        _, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            results = await asyncio.gather(
                *(c.call_tool("sim/echo", {"i": i}) for i in range(3)))
        self.assertEqual(results, [{"echo": {"i": i}} for i in range(3)])

    async def test_an_error_answer_is_a_gabp_error(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            await send(error(msg, -32007, "slow down", {"retryAfterMs": 250}))

        _, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            with self.assertRaises(gabp_relay.GabpError) as caught:
                await c.call_tool("sim/echo")
            e = caught.exception
            self.assertEqual(e.code, gabp_relay.ErrorCode.SLOW_DOWN)
            self.assertEqual(e.message, "slow down")
            self.assertEqual(e.retry_after, 0.25)
            self.assertEqual(e.method, "tools/call")
            self.assertIn("-32007 slow down", str(e))
            self.assertFalse(c.closed, "an error answer leaves the connection open")

    async def test_a_refused_hello_raises_and_closes(self) -> None:
        fake, addr = await self.relay()

        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            body = await framing.read_body(reader, 1 << 20)
            assert body is not None
            writer.write(error(json.loads(body), -31000, "invalid token"))
            await writer.drain()
            await reader.read()
            writer.close()

        fake.serve = refuse  # type: ignore[method-assign]
        await fake.stop()
        addr = await fake.start()
        with self.assertRaises(gabp_relay.GabpError) as caught:
            await gabp_relay.connect(addr, token="wrong")
        self.assertEqual(caught.exception.code, gabp_relay.ErrorCode.BAD_TOKEN)

    async def test_events_come_in_order_even_ahead_of_the_subscribe_answer(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            if msg["method"] == "events/subscribe":
                await send(b"".join(event("world/tick", s, {"s": s}) for s in range(100)))
                await send(answer(msg, {"subscribed": msg["params"]["channels"]}))

        fake, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            sub = await c.subscribe(["world/tick"])
            self.assertEqual(sub.pending, 100, "events ahead of the answer are kept")
            seqs = [(await sub.next(5)).seq for _ in range(100)]
            self.assertEqual(c.last_seqs, {"world/tick": 99})
        self.assertEqual(seqs, list(range(100)))
        self.assertEqual(fake.requests[0]["params"], {"channels": ["world/tick"]})

    async def test_a_full_buffer_drops_the_oldest_and_says_so(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            if msg["method"] == "events/subscribe":
                await send(answer(msg, {"subscribed": msg["params"]["channels"]}))
            else:
                notice = event("relay/lease", 0, {"change": "acquired"})
                await send(notice + b"".join(event("world/tick", s, s) for s in range(25)))
                await send(answer(msg, {}))

        _, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN, max_queue=11) as c:
            sub = await c.subscribe("world/tick")
            await c.request("state/get", {})  # answered after the 25 events: all are in
            first = await sub.next(1)
            self.assertEqual(first.channel, "relay/dropped")
            self.assertEqual(first.payload, {"channel": "world/tick", "fromSeq": 0, "toSeq": 14,
                                             "count": 15, "policy": "client-queue"})
            self.assertEqual((await sub.next(1)).channel, "relay/lease", "notices are kept")
            rest = [(await sub.next(1)).seq for _ in range(10)]
            self.assertEqual(rest, list(range(15, 25)))
            self.assertEqual(sub.dropped, 15)

    async def test_a_lost_connection_fails_requests_and_ends_subscriptions(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            if msg["method"] == "events/subscribe":
                await send(answer(msg, {}) + event("world/tick", 0, None))
            else:
                raise ConnectionResetError  # the relay goes away without answering

        _, addr = await self.relay(handler)
        c = await gabp_relay.connect(addr, token=TOKEN)
        sub = await c.subscribe(["world/tick"])
        with self.assertRaises(gabp_relay.ConnectionClosed):
            await c.call_tool("sim/echo")
        self.assertTrue(c.closed)
        self.assertEqual((await sub.next(1)).seq, 0, "what was received is still delivered")
        with self.assertRaises(gabp_relay.ConnectionClosed):
            await sub.next(1)
        with self.assertRaises(gabp_relay.ConnectionClosed):
            await c.status()
        await c.close()

    async def test_broken_framing_closes_with_a_reason(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            await send(b"Content-Length: lots\r\n\r\n{}")

        _, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            with self.assertRaises(gabp_relay.ConnectionClosed) as caught:
                await c.status()
            self.assertIn("framing", caught.exception.reason)

    async def test_close_ends_iteration_quietly(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            await send(answer(msg, {}))

        _, addr = await self.relay(handler)
        c = await gabp_relay.connect(addr, token=TOKEN)
        sub = await c.subscribe(["world/tick"])

        async def drain() -> list[gabp_relay.Event]:
            return [e async for e in sub]

        task = asyncio.create_task(drain())
        await asyncio.sleep(0.05)
        await c.close()
        self.assertEqual(await asyncio.wait_for(task, 5), [])
        self.assertEqual(c.close_reason, "closed by this client")

    async def test_unsubscribe_asks_the_relay_and_ends_iteration(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            await send(answer(msg, {}))

        fake, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            a = await c.subscribe(["world/tick", "chat/message"])
            await c.subscribe(["chat/message"])
            await a.unsubscribe()
            self.assertEqual([e async for e in a], [])
        self.assertEqual(fake.requests[-1]["method"], "events/unsubscribe")
        self.assertEqual(fake.requests[-1]["params"], {"channels": ["world/tick"]},
                         "a channel another subscription holds stays subscribed")

    async def test_resume_names_the_session_and_last_seqs(self) -> None:
        fake, addr = await self.relay()
        point = gabp_relay.ResumePoint(SESSION, {"world/tick": 41, "chat/message": -1})

        async def welcome_then_history(reader: asyncio.StreamReader,
                                       writer: asyncio.StreamWriter) -> None:
            body = await framing.read_body(reader, 1 << 20)
            assert body is not None
            msg = json.loads(body)
            fake.hellos.append(msg)
            w = welcome(resume={"resumed": True, "window": {}})
            writer.write(answer(msg, w) + event("world/tick", 42, "missed")
                         + event("world/tick", 43, "live"))
            await writer.drain()
            await reader.read()
            writer.close()

        fake.serve = welcome_then_history  # type: ignore[method-assign]
        await fake.stop()
        addr = await fake.start()
        async with gabp_relay.connect(addr, token=TOKEN, resume=point) as c:
            assert c.resumed is not None
            got = [await c.resumed.next(5) for _ in range(2)]
            self.assertEqual([(e.seq, e.payload) for e in got], [(42, "missed"), (43, "live")])
            want = gabp_relay.ResumePoint(SESSION, {"chat/message": -1, "world/tick": 43})
            self.assertEqual(c.resume_point, want)
        self.assertEqual(fake.hellos[0]["params"]["relay"],
                         {"resume": {"session": SESSION,
                                     "channels": {"world/tick": 41, "chat/message": -1}}})

    async def test_a_new_session_starts_seqs_again(self) -> None:
        new = "019ad2f0-0000-7000-8000-000000000002"

        async def handler(msg: dict[str, Any], send: Send) -> None:
            if msg["method"] == "events/subscribe":
                await send(answer(msg, {}) + event("world/tick", 0, None)
                           + event("world/tick", 1, None)
                           + event("relay/session", 0, {"state": "ended", "sessionId": SESSION})
                           + event("relay/session", 1, {"state": "started", "sessionId": new}))

        _, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            sub = await c.subscribe(["world/tick"])
            got = [await sub.next(5) for _ in range(4)]
            self.assertEqual([e.channel for e in got],
                             ["world/tick", "world/tick", "relay/session", "relay/session"])
            self.assertTrue(got[3].is_notice)
            self.assertEqual(c.session_id, new)
            self.assertEqual(c.resume_point, gabp_relay.ResumePoint(new, {"world/tick": -1}))

    async def test_a_request_over_max_body_is_refused_here(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            await send(answer(msg, {"ok": True}))

        fake, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            with self.assertRaises(ValueError):
                await c.call_tool("sim/echo", {"big": "x" * 5000})
            self.assertEqual(await c.call_tool("sim/echo", {"small": 1}), {"ok": True})
        self.assertEqual(len(fake.requests), 1, "the big one never left")

    async def test_mark_and_lease_speak_the_relays_params(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            p = msg["params"]
            if msg["method"] == "relay/mark":
                await send(answer(msg, {"marked": True, "label": p["label"], "tNs": 5}))
            elif p["action"] == "release":
                await send(answer(msg, {"held": False}))
            else:
                await send(answer(msg, {"held": True, "holder": "default", "conn": 3,
                                        "untilNs": 9, "ttlMs": p.get("ttlMs", 30000)}))

        fake, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            m = await c.mark("episode-start", {"episode": 1, "big": 2**70})
            self.assertEqual(m, gabp_relay.Mark(True, "episode-start", 5))
            with self.assertRaises(ValueError):
                await c.mark("")
            async with c.holding_lease(ttl_ms=90) as lease:
                self.assertEqual((lease.held, lease.holder, lease.ttl_ms), (True, "default", 90))
                await asyncio.sleep(0.2)
        self.assertEqual(fake.requests[0]["params"],
                         {"label": "episode-start", "data": {"episode": 1, "big": 2**70}})
        actions = [r["params"]["action"] for r in fake.requests[1:]]
        self.assertEqual(actions[0], "acquire")
        self.assertEqual(actions[-1], "release")
        self.assertIn("renew", actions, "renewed while held")
        self.assertEqual(fake.requests[1]["params"]["ttlMs"], 90)

    async def test_replay_speaks_the_relays_params(self) -> None:
        async def handler(msg: dict[str, Any], send: Send) -> None:
            await send(answer(msg, {"state": "paused", "atMs": 12.5, "speed": 1}))

        fake, addr = await self.relay(handler)
        async with gabp_relay.connect(addr, token=TOKEN) as c:
            state = await c.replay("seek", to_ms=12.5)
            self.assertEqual(state["state"], "paused")
            await c.replay("seek", channel="world/tick", to_seq=7)
            await c.replay("step", events=100)
            await c.replay("speed", speed="max")
        self.assertEqual([r["method"] for r in fake.requests], ["relay/replay"] * 4)
        self.assertEqual([r["params"] for r in fake.requests], [
            {"action": "seek", "toMs": 12.5},
            {"action": "seek", "channel": "world/tick", "toSeq": 7},
            {"action": "step", "events": 100},
            {"action": "speed", "speed": "max"},
        ])

    async def test_the_bridge_file_gives_address_and_token(self) -> None:
        fake, addr = await self.relay()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "bridge.json")
            with open(path, "w") as f:
                json.dump({"token": TOKEN, "transport": {"type": "tcp", "address": addr},
                           "metadata": {"route": "lab/a", "pid": 1}}, f)
            found = gabp_relay.read_bridge_file(path)
            self.assertEqual((found.address, found.token, found.route), (addr, TOKEN, "lab/a"))
            async with gabp_relay.connect(bridge_file=path) as c:
                self.assertEqual(c.session_id, SESSION)
            os.environ["XDG_CONFIG_HOME"] = d
            try:
                self.assertEqual(str(gabp_relay.default_path("lab/a")),
                                 os.path.join(d, "gabp-relay", "bridge-lab%2Fa.json"))
            finally:
                del os.environ["XDG_CONFIG_HOME"]
        self.assertEqual(fake.hellos[0]["params"]["token"], TOKEN)


class ExportTest(unittest.TestCase):
    LINES = [
        '{"session":"s1","frame":0,"tNs":1700000000000000000,"offsetMs":0.0,'
        '"dir":"bridge->relay","conn":1,"kind":"request","channel":null,"modSeq":null,'
        '"relaySeq":null,"tags":{"seed":"7"},"msg":{"v":"gabp/1","id":"a","type":"request",'
        '"method":"tools/call","params":{"name":"sim/echo"}}}',
        '{"session":"s1","frame":1,"tNs":1700000000000000001,"offsetMs":0.5,'
        '"dir":"bridge->relay","conn":1,"kind":"mark","channel":null,"modSeq":null,'
        '"relaySeq":null,"label":"episode-start","tags":{},"data":{"n":123456789012345678901234},'
        '"episode":1,"msg":{"v":"gabp/1","id":"b","type":"request","method":"relay/mark","params":{}}}',
        '',
        '{"session":"s1","frame":2,"tNs":1700000000000000002,"offsetMs":1.0,'
        '"dir":"mod->relay","conn":0,"kind":"other","channel":null,"modSeq":null,'
        '"relaySeq":null,"tags":{},"raw":"not json"}',
        '{"session":"s1","frame":3,"tNs":1700000000000000003,"offsetMs":1.5,'
        '"dir":"relay->bridge","conn":1,"kind":"response","channel":null,"modSeq":null,'
        '"relaySeq":null,"tags":{},"msg":{"v":"gabp/1","id":"a","type":"response",'
        '"error":{"code":-32008,"message":"leased"}}}',
    ]

    def test_rows_are_typed(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.jsonl")
            with open(path, "w") as f:
                f.write("\n".join(self.LINES) + "\n")
            rows = list(gabp_relay.read_export(path))
        self.assertEqual([r.frame for r in rows], [0, 1, 2, 3])
        call, mark, other, refusal = rows
        self.assertEqual((call.kind, call.method, call.id), ("request", "tools/call", "a"))
        self.assertEqual(call.tags, {"seed": "7"})
        self.assertEqual(call.payload, {"name": "sim/echo"})
        self.assertEqual(mark.label, "episode-start")
        self.assertEqual(mark.data, {"n": 123456789012345678901234})
        # The episode a row lies in; none outside one (and in exports from before the column).
        self.assertEqual((mark.episode, call.episode), (1, None))
        self.assertEqual((other.msg, other.raw), (None, "not json"))
        self.assertEqual(refusal.error_code, -32008)
        self.assertEqual(call.t_ns, 1700000000000000000)

    def test_any_iterable_of_lines_and_a_bad_line(self) -> None:
        rows = list(gabp_relay.read_export(line.encode() for line in self.LINES))
        self.assertEqual(len(rows), 4)
        with self.assertRaises(ValueError) as caught:
            list(gabp_relay.read_export([self.LINES[0], "{}"]))
        self.assertIn("line 2", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
