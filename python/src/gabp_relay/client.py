"""A bridge: one connection to a gabp-relay route, speaking GABP as an agent would to the mod.

Owns the connection's life (connect, ``session/hello``, close), requests multiplexed over it
(a UUID id each, answered through a future, any number in flight), and delivering events, in
the order the relay sent them, to subscriptions. One reader task reads every frame; it never
waits for the application, so answers are never stuck behind unread events and the relay never
sees this bridge as stuck. Each subscription's buffer is bounded instead: past it the oldest
events are dropped, and a ``relay/dropped`` notice with ``"policy": "client-queue"`` says so, as
the relay does for its own drops.

It does not retry anything: a request whose connection is lost has an unknown outcome, and
reconnecting (with ``resume=``) is the application's decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterable, Mapping
from types import TracebackType
from typing import Any

from . import framing
from .discovery import read_bridge_file
from .errors import ConnectionClosed, GabpError
from .model import NOTICE_PREFIX, Event, Lease, Mark, ResumePoint, Tool

__version__ = "0.1.0"

#: Events a subscription holds for the application before it drops the oldest.
DEFAULT_MAX_QUEUE = 16_384
#: The largest frame read from the relay (a welcome, an answer, an event).
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
#: Longest mark label the relay accepts, in bytes.
MAX_MARK_LABEL = 256


def _platform() -> str:
    if sys.platform.startswith("linux"):
        return "linux"
    if sys.platform == "darwin":
        return "macos"
    if sys.platform in ("win32", "cygwin"):
        return "windows"
    return sys.platform


async def _open(address: str, limit: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Opens ``HOST:PORT`` (``[v6]:PORT`` too) or ``unix:PATH``, as the relay prints them."""
    if address.startswith("unix:"):
        return await asyncio.open_unix_connection(address[len("unix:"):], limit=limit)
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"invalid address {address!r}: expected HOST:PORT or unix:PATH")
    return await asyncio.open_connection(host.strip("[]"), int(port), limit=limit)


class Subscription:
    """The events of some channels, in the relay's order: ``async for event in sub``.

    It also gets the relay's notices: every ``relay/…`` event but ``relay/dropped``, and the
    ``relay/dropped`` notices of its own channels. Iteration ends (``StopAsyncIteration``) after
    :meth:`unsubscribe` or :meth:`Client.close`, once the buffered events are taken; if the
    connection was lost it raises :class:`ConnectionClosed` there instead.
    """

    def __init__(self, client: Client, channels: Iterable[str], max_queue: int) -> None:
        self._client = client
        #: The channels this subscription asked for.
        self.channels: frozenset[str] = frozenset(channels)
        self._max = max(1, max_queue)
        self._buf: deque[Event] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # Why iteration ends once the buffer is empty: a ConnectionClosed (the connection was
        # lost) or a StopAsyncIteration (unsubscribed, or the client closed).
        self._end: ConnectionClosed | StopAsyncIteration | None = None
        # Per channel, what this client dropped and has not said yet: [fromSeq, toSeq, count].
        self._drops: dict[str, list[int]] = {}
        #: Events dropped here since the start because the application fell behind.
        self.dropped = 0

    def __repr__(self) -> str:
        return f"Subscription({sorted(self.channels)!r}, pending={len(self._buf)})"

    @property
    def pending(self) -> int:
        """Events received and not yet taken."""
        return len(self._buf)

    def wants(self, event: Event) -> bool:
        if event.channel in self.channels:
            return True
        if event.channel == "relay/dropped":
            payload = event.payload
            return isinstance(payload, dict) and payload.get("channel") in self.channels
        return event.is_notice

    def _put(self, event: Event) -> None:
        if self._end is not None:
            return
        if len(self._buf) >= self._max:
            self._drop_oldest()
        self._buf.append(event)
        self._wake()

    def _drop_oldest(self) -> None:
        # The relay's notices are few and say what the mod's events mean: they are kept.
        for i, old in enumerate(self._buf):
            if not old.is_notice:
                del self._buf[i]
                self.dropped += 1
                span = self._drops.setdefault(old.channel, [old.seq, old.seq, 0])
                span[1] = old.seq
                span[2] += 1
                return

    def _finish(self, end: ConnectionClosed | StopAsyncIteration) -> None:
        if self._end is None:
            self._end = end
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._drops:
                channel, (first, last, count) = next(iter(self._drops.items()))
                del self._drops[channel]
                payload = {"channel": channel, "fromSeq": first, "toSeq": last, "count": count,
                           "policy": "client-queue"}
                return Event("relay/dropped", -1, payload, {"channel": "relay/dropped",
                                                            "payload": payload})
            if self._buf:
                return self._buf.popleft()
            if isinstance(self._end, ConnectionClosed):
                raise ConnectionClosed(self._end.reason)
            if self._end is not None:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def next(self, timeout: float | None = None) -> Event:
        """The next event, waiting at most ``timeout`` seconds (``asyncio.TimeoutError``
        then)."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    async def unsubscribe(self) -> None:
        """Stops this subscription: the relay stops sending its channels (those no other
        subscription of this client holds); events already buffered are still yielded."""
        client = self._client
        if self not in client._subs:
            return
        client._subs.remove(self)
        self._finish(StopAsyncIteration())
        others = {c for s in client._subs for c in s.channels}
        gone = sorted(self.channels - others)
        if gone and not client.closed:
            await client.request("events/unsubscribe", {"channels": gone})


class Client:
    """One bridge connection to a relay route. Make one with :func:`connect`.

    After the welcome, ``welcome`` is the mod's welcome as the relay answered it, ``relay`` the
    relay's extension in it (route, session id, backpressure policy, ``maxBodyBytes``, the
    bridge's identity and role, resume window), ``session_id`` the current session (kept up to
    date from ``relay/session`` notices). ``resumed`` is the subscription a ``resume=`` hello
    made, if any.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 max_queue: int = DEFAULT_MAX_QUEUE, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._reader = reader
        self._writer = writer
        self._max_queue = max_queue
        self._max_frame = max_frame
        self._pending: dict[str, tuple[asyncio.Future[Any], str]] = {}
        self._subs: list[Subscription] = []
        # Last relay seq received per mod channel, in the current session.
        self._last: dict[str, int] = {}
        self._drain = asyncio.Lock()
        self._closed: ConnectionClosed | None = None
        self._closing = False
        self.welcome: dict[str, Any] = {}
        self.relay: dict[str, Any] = {}
        self.session_id: str | None = None
        self.max_body: int | None = None
        self.resumed: Subscription | None = None
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    def connect(cls, address: str | None = None, **kwargs: Any) -> Connecting:
        """The same as :func:`connect`."""
        return connect(address, **kwargs)

    # --- life -------------------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """Whether the connection has ended (closed here or lost)."""
        return self._closed is not None

    @property
    def close_reason(self) -> str | None:
        """How the connection ended, once it has."""
        return self._closed.reason if self._closed else None

    async def close(self) -> None:
        """Closes the connection. Requests still waiting get :class:`ConnectionClosed`;
        subscriptions end once their buffered events are taken."""
        self._closing = True
        if not self._task.done():
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def wait_closed(self) -> str:
        """Waits until the connection ends; returns how it ended."""
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(self._task)
        return self.close_reason or "closed"

    # --- requests ---------------------------------------------------------------------------

    async def request(self, method: str, params: Mapping[str, Any] | None = None, *,
                      timeout: float | None = None) -> Any:
        """Sends any GABP request (``state/get``, ``attention/current``, …) and returns its
        result. Raises :class:`GabpError` for an error answer, :class:`ConnectionClosed` if the
        connection ends first (the outcome is then unknown), ``asyncio.TimeoutError`` after
        ``timeout`` seconds (a late answer is then dropped), and ``ValueError`` for a request
        the relay would refuse for its size (``maxBodyBytes``) or because it is not JSON."""
        if self._closed is not None:
            raise ConnectionClosed(self._closed.reason)
        rid = str(uuid.uuid4())
        msg: dict[str, Any] = {"v": "gabp/1", "id": rid, "type": "request", "method": method}
        if params is not None:
            msg["params"] = dict(params)
        body = framing.encode_body(msg)
        if self.max_body is not None and len(body) > self.max_body:
            raise ValueError(f"{method}: a request of {len(body)} bytes is over the relay's "
                             f"maxBodyBytes ({self.max_body})")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (fut, method)
        try:
            self._writer.write(framing.frame(body))
            async with self._drain:
                await self._writer.drain()
            return await asyncio.wait_for(fut, timeout)
        except (ConnectionError, OSError) as e:
            if isinstance(e, ConnectionClosed):
                raise
            raise ConnectionClosed(f"writing to the relay failed: {e}") from e
        finally:
            self._pending.pop(rid, None)

    async def list_tools(self) -> list[Tool]:
        """The mod's tools (``tools/list``)."""
        result = await self.request("tools/list", {})
        tools = result.get("tools") if isinstance(result, dict) else None
        return [Tool.from_json(t) for t in tools or [] if isinstance(t, dict)]

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None, *,
                        timeout: float | None = None) -> Any:
        """Calls a tool of the mod (``tools/call``) and returns its result as the mod wrote
        it."""
        return await self.request("tools/call", {"name": name, "arguments": dict(arguments or {})},
                                  timeout=timeout)

    async def status(self) -> dict[str, Any]:
        """The relay's ``relay/status``: route, session, lease, recorder, every other bridge."""
        result = await self.request("relay/status", {})
        return result if isinstance(result, dict) else {}

    async def mark(self, label: str, data: Any = None) -> Mark:
        """Marks the session's timeline (``relay/mark``): an episode's start or end, a test
        step. The relay records it with this bridge and its time; ``export`` shows it as a row
        of kind ``mark``. A label is 1 to 256 bytes; the whole mark at most 2 KiB."""
        size = len(label.encode("utf-8"))
        if not 0 < size <= MAX_MARK_LABEL:
            raise ValueError(f"a mark label is 1 to {MAX_MARK_LABEL} bytes, not {size}")
        params: dict[str, Any] = {"label": label}
        if data is not None:
            params["data"] = data
        result = await self.request("relay/mark", params)
        return Mark.from_json(result if isinstance(result, dict) else {})

    async def lease(self, action: str = "acquire", ttl_ms: int | None = None) -> Lease:
        """``relay/lease``: ``acquire`` (or renew one's own), ``renew`` or ``release`` the
        route's lease on its leased tools, for ``ttl_ms`` (30 s by default). Held by another
        bridge: :class:`GabpError` -32008 with the holder in ``data``."""
        params: dict[str, Any] = {"action": action}
        if ttl_ms is not None:
            params["ttlMs"] = ttl_ms
        result = await self.request("relay/lease", params)
        return Lease.from_json(result if isinstance(result, dict) else {})

    async def replay(self, action: str, **params: Any) -> dict[str, Any]:
        """``relay/replay``: controls a ``gabp-relay replay`` for every bridge attached to it, and
        returns its state (``state``, ``atMs``, ``speed``, ...). ``action`` is ``pause``,
        ``resume``, ``state``, ``seek`` (``to_ms=``, ``to_mark=``, or ``channel=`` and
        ``to_seq=``), ``step`` (``events=`` or ``to_mark=``) or ``speed`` (``speed=`` a factor
        or ``"max"``); keyword names may be given in the relay's camelCase too. Every change
        reaches every bridge as a ``relay/replay`` event, in order with the events. A live
        relay answers :class:`GabpError` -32601; an ``observe`` bridge may only ask the state
        (-32006)."""
        body: dict[str, Any] = {"action": action}
        for key, value in params.items():
            head, *rest = key.split("_")
            body[head + "".join(w.title() for w in rest)] = value
        result = await self.request("relay/replay", body)
        return result if isinstance(result, dict) else {}

    @contextlib.asynccontextmanager
    async def holding_lease(self, ttl_ms: int = 30_000) -> AsyncIterator[Lease]:
        """``async with c.holding_lease():`` acquires the lease, renews it every third of its
        time to live while the block runs, and releases it at the end. A renewal refused (the
        lease was taken over after an expiry) ends the renewing; leased calls then fail with
        -32008."""
        held = await self.lease("acquire", ttl_ms)

        async def renew() -> None:
            while True:
                await asyncio.sleep(ttl_ms / 3000)
                try:
                    await self.lease("renew", ttl_ms)
                except (GabpError, ConnectionClosed):
                    return

        task = asyncio.get_running_loop().create_task(renew())
        try:
            yield held
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if not self.closed:
                with contextlib.suppress(GabpError, ConnectionClosed):
                    await self.lease("release")

    # --- events -----------------------------------------------------------------------------

    async def subscribe(self, channels: Iterable[str] | str, *,
                        max_queue: int | None = None) -> Subscription:
        """Subscribes to ``channels`` (``events/subscribe``) and returns their events as an
        async iterator. Events that arrive before the relay's answer are kept: the
        subscription exists before the request is sent. ``max_queue`` bounds its buffer
        (16,384 events unless the client says otherwise)."""
        names = [channels] if isinstance(channels, str) else list(dict.fromkeys(channels))
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError("channels must be one or more non-empty channel names")
        sub = Subscription(self, names, max_queue or self._max_queue)
        self._subs.append(sub)
        try:
            await self.request("events/subscribe", {"channels": names})
        except BaseException:
            if sub in self._subs:
                self._subs.remove(sub)
            raise
        return sub

    @property
    def last_seqs(self) -> dict[str, int]:
        """The last relay seq received per mod channel in the current session."""
        return dict(self._last)

    @property
    def resume_point(self) -> ResumePoint | None:
        """Where to resume from after a drop: this session, and per mod channel subscribed to,
        the last relay seq received (``-1``: none yet). ``None`` before a session."""
        if self.session_id is None:
            return None
        subscribed = {c for s in self._subs for c in s.channels if not c.startswith(NOTICE_PREFIX)}
        return ResumePoint(self.session_id, {c: self._last.get(c, -1) for c in sorted(subscribed)})

    # --- the reader -------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        reason = "the relay closed the connection"
        try:
            while True:
                body = await framing.read_body(self._reader, self._max_frame)
                if body is None:
                    break
                try:
                    msg = json.loads(body)
                except ValueError as e:
                    raise framing.FramingError(f"a frame that is not JSON: {e}") from e
                if isinstance(msg, dict):
                    self._dispatch(msg)
        except asyncio.CancelledError:
            reason = "closed by this client"
        except asyncio.IncompleteReadError:
            reason = "the connection ended inside a frame"
        except framing.FramingError as e:
            reason = f"the relay's framing is broken: {e}"
        except OSError as e:
            reason = f"the connection failed: {e}"
        except Exception as e:  # a bug here must still fail the callers, not hang them
            reason = f"the client's reader failed: {e!r}"
        finally:
            if self._closing:
                reason = "closed by this client"
            self._shut(reason)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "response":
            entry = self._pending.pop(str(msg.get("id")), None)
            if entry is None:
                return  # its caller gave up (timeout, cancellation)
            fut, method = entry
            if fut.done():
                return
            err = msg.get("error")
            if isinstance(err, dict):
                code = err.get("code")
                fut.set_exception(GabpError(code if isinstance(code, int) else 0,
                                            str(err.get("message", "")), err.get("data"),
                                            method=method))
            else:
                result = msg.get("result")
                if method == "session/hello":
                    # Now, before the frames after it: a resume's history and a new session's
                    # notice follow the welcome at once and must find it applied.
                    self._welcomed(result)
                fut.set_result(result)
        elif kind == "event":
            event = Event.from_message(msg)
            if not event.is_notice:
                self._last[event.channel] = event.seq
            elif event.channel == "relay/session" and isinstance(event.payload, dict):
                if event.payload.get("state") == "started":
                    sid = event.payload.get("sessionId")
                    self.session_id = sid if isinstance(sid, str) else None
                    self._last.clear()  # seqs start again at 0 in a new session
            for sub in self._subs:
                if sub.wants(event):
                    sub._put(event)

    def _shut(self, reason: str) -> None:
        if self._closed is not None:
            return
        self._closed = ConnectionClosed(reason)
        for fut, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionClosed(reason))
        self._pending.clear()
        for sub in self._subs:
            sub._finish(StopAsyncIteration() if self._closing else ConnectionClosed(reason))
        if not self._writer.is_closing():
            self._writer.close()

    async def _hello(self, token: str, name: str | None, resume: ResumePoint | None,
                     without_mod: bool) -> None:
        params: dict[str, Any] = {
            "token": token,
            "bridgeVersion": f"gabp-relay-python/{__version__}",
            "platform": _platform(),
            "launchId": str(uuid.uuid4()),
        }
        if name:
            params["clientInfo"] = {"name": name}
        relay: dict[str, Any] = {}
        if without_mod:
            relay["withoutMod"] = True
        if resume is not None:
            relay["resume"] = resume.to_json()
            # Made before the hello: history follows the welcome at once, and continues from
            # these seqs (a relay/session notice clears them if the session is another).
            self.resumed = Subscription(self, resume.channels, self._max_queue)
            self._subs.append(self.resumed)
            self._last = {c: s for c, s in resume.channels.items() if s >= 0}
        if relay:
            params["relay"] = relay
        try:
            await self.request("session/hello", params)
        except BaseException:
            if self.resumed is not None and self.resumed in self._subs:
                self._subs.remove(self.resumed)
            self.resumed = None
            self._last.clear()
            raise

    def _welcomed(self, welcome: Any) -> None:
        self.welcome = welcome if isinstance(welcome, dict) else {}
        caps = self.welcome.get("capabilities")
        exts = caps.get("extensions") if isinstance(caps, dict) else None
        ext = exts.get("relay") if isinstance(exts, dict) else None
        self.relay = ext if isinstance(ext, dict) else {}
        sid = self.relay.get("sessionId")
        self.session_id = sid if isinstance(sid, str) else None
        body = self.relay.get("maxBodyBytes")
        self.max_body = body if isinstance(body, int) and body > 0 else None


class Connecting:
    """What :func:`connect` returns: ``await`` it for a :class:`Client`, or use it as
    ``async with connect(...) as client:`` to close the client at the end of the block."""

    def __init__(self, open_client: Callable[[], Coroutine[Any, Any, Client]]) -> None:
        self._open = open_client
        self._client: Client | None = None

    def __await__(self) -> Generator[Any, None, Client]:
        return self._open().__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._open()
        return self._client

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._client is not None:
            await self._client.close()


def connect(address: str | None = None, *, token: str | None = None,
            bridge_file: str | os.PathLike[str] | None = None, route: str = "default",
            name: str | None = None, resume: ResumePoint | None = None,
            without_mod: bool = False, timeout: float | None = 30.0,
            max_queue: int = DEFAULT_MAX_QUEUE, max_frame: int = DEFAULT_MAX_FRAME) -> Connecting:
    """Connects a bridge to a relay route and says hello.

    Where: ``address`` (``HOST:PORT`` or ``unix:PATH``) with ``token`` (else
    ``$GABP_RELAY_TOKEN``); or a discovery file, ``bridge_file`` or else route ``route``'s
    default one, which holds both (``token=`` still wins).

    ``name`` is this bridge's label in ``status``, stats and the recording. ``resume`` (a
    :attr:`Client.resume_point` of an earlier connection) resumes after a drop: its channels
    are subscribed again and, in the same session, every event missed follows the welcome, in
    order (the subscription is :attr:`Client.resumed`). ``without_mod`` asks for a relay-only
    bridge (``relay/status`` only, never recorded, welcomed with no mod connected).
    ``timeout`` bounds connecting and the welcome (a hello waits up to 10 s for a mod).

    Raises :class:`GabpError` when the hello is refused (-31000 wrong token, -32000 no mod,
    -32602 a bad resume), ``OSError`` when nothing listens there, ``FileNotFoundError`` when
    there is no discovery file.
    """

    async def open_client() -> Client:
        addr, tok = address, token
        if addr is None:
            found = read_bridge_file(bridge_file, route=route)
            addr = found.address
            tok = tok if tok is not None else found.token
        if tok is None:
            tok = os.environ.get("GABP_RELAY_TOKEN")
        if tok is None:
            raise ValueError("no token: pass token=, set GABP_RELAY_TOKEN, or use a bridge file")

        async def handshake() -> Client:
            reader, writer = await _open(addr, limit=2 * framing.MAX_HEADER_BYTES + 256 * 1024)
            client = Client(reader, writer, max_queue=max_queue, max_frame=max_frame)
            try:
                await client._hello(tok, name, resume, without_mod)
            except BaseException:
                await client.close()
                raise
            return client

        return await asyncio.wait_for(handshake(), timeout)

    return Connecting(open_client)
