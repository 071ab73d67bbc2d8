"""The typed values a bridge gets from the relay: events, tools, a mark's and a lease's answers,
and where to resume from.

Owns their shapes and how each is read from its JSON; it does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Channels whose events the relay itself sends (drops, sessions, the lease, revocations,
#: replay). Their seq is the relay's own, not a mod channel's.
NOTICE_PREFIX = "relay/"


@dataclass(frozen=True, slots=True)
class Event:
    """One event: its ``channel``, the relay's ``seq`` on it (0, 1, 2, … per session and
    channel, the same for every subscriber) and its ``payload``; ``message`` is the whole
    envelope as received (``id``, a mod's ``timestamp``, …).

    Notices from the relay are events too, on ``relay/dropped``, ``relay/session``,
    ``relay/lease``, ``relay/revoked`` and ``relay/replay`` (:attr:`is_notice`).
    """

    channel: str
    seq: int
    payload: Any
    message: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_notice(self) -> bool:
        """Whether the relay sent this (a ``relay/…`` channel) rather than the mod."""
        return self.channel.startswith(NOTICE_PREFIX)

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Event:
        channel = message.get("channel")
        seq = message.get("seq")
        return cls(
            channel if isinstance(channel, str) else "",
            seq if isinstance(seq, int) and not isinstance(seq, bool) else -1,
            message.get("payload"),
            message,
        )


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool the mod offers (``tools/list``): ``name`` is what :meth:`Client.call_tool`
    takes; ``spec`` is the whole entry as the mod wrote it (annotations and all)."""

    name: str
    title: str | None
    description: str | None
    input_schema: dict[str, Any] | None
    output_schema: dict[str, Any] | None
    spec: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, spec: dict[str, Any]) -> Tool:
        def text(key: str) -> str | None:
            v = spec.get(key)
            return v if isinstance(v, str) else None

        def obj(key: str) -> dict[str, Any] | None:
            v = spec.get(key)
            return v if isinstance(v, dict) else None

        return cls(str(spec.get("name", "")), text("title"), text("description"),
                   obj("inputSchema"), obj("outputSchema"), spec)


@dataclass(frozen=True, slots=True)
class Mark:
    """The relay's answer to ``relay/mark``. ``marked`` is false where nothing is recorded
    (a replay, ``--no-record``), with ``why``; ``t_ns`` is the relay's time of the mark."""

    marked: bool
    label: str
    t_ns: int
    why: str | None = None

    @classmethod
    def from_json(cls, result: dict[str, Any]) -> Mark:
        why = result.get("why")
        return cls(result.get("marked") is True, str(result.get("label", "")),
                   int(result.get("tNs") or 0), why if isinstance(why, str) else None)


@dataclass(frozen=True, slots=True)
class Lease:
    """The relay's answer to ``relay/lease``: whether this bridge now ``held`` it, and, while
    held, the ``holder``'s identity name, its connection number, until when (ns since the
    epoch) and the granted time to live."""

    held: bool
    holder: str | None = None
    conn: int | None = None
    until_ns: int | None = None
    ttl_ms: int | None = None

    @classmethod
    def from_json(cls, result: dict[str, Any]) -> Lease:
        def num(key: str) -> int | None:
            v = result.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        holder = result.get("holder")
        return cls(result.get("held") is True, holder if isinstance(holder, str) else None,
                   num("conn"), num("untilNs"), num("ttlMs"))


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a bridge left off: the ``session`` id from its welcome and, per mod channel it was
    subscribed to, the last relay seq it received (``-1``: none yet). Pass it to
    :func:`gabp_relay.connect` as ``resume=`` to get, within the same session, every event
    missed since, with no gap and no duplicate."""

    session: str
    channels: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session, "channels": dict(self.channels)}
