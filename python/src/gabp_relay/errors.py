"""What a request can fail with: an error answer (:class:`GabpError`, its code one of
:class:`ErrorCode`), or the connection going away (:class:`ConnectionClosed`).

Owns the error types and the relay's error codes; raising them is the client's business.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.IntEnum):
    """The error codes bridges see (docs/reference/wire.md, "Error codes")."""

    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    #: No mod connected (or recording is stalled): not forwarded; retry once the mod is back.
    MOD_UNAVAILABLE = -32000
    #: Forwarded, then the mod left, the request timed out, or its answer was unreadable.
    OUTCOME_UNKNOWN = -32001
    #: A limit was reached (pending requests, subscriptions, bridges, marks): later.
    LIMIT_EXCEEDED = -32002
    TOO_LARGE = -32003
    #: In a replay: no recorded answer to this method and params.
    NO_RECORDED_RESPONSE = -32004
    #: The relay is shutting down; the outcome is unknown.
    SHUTTING_DOWN = -32005
    #: Forbidden by the identity's role or globs (the message names the rule).
    FORBIDDEN = -32006
    #: Over ``calls_per_second``: ``data["retryAfterMs"]`` says when to try again.
    SLOW_DOWN = -32007
    #: The tool is leased and this bridge does not hold the lease (``data``: holder, conn,
    #: untilNs).
    LEASE_HELD = -32008
    BAD_TOKEN = -31000
    NO_SESSION = -31001


class GabpError(Exception):
    """An error answer to a request: its ``code``, ``message`` and optional ``data``.

    ``code`` is an ``int`` (compare it with :class:`ErrorCode`, an ``IntEnum``); a mod may use
    codes of its own.
    """

    def __init__(self, code: int, message: str, data: Any = None, *, method: str = "") -> None:
        super().__init__(code, message, data)
        self.code = code
        self.message = message
        self.data = data
        #: The method of the request this answers.
        self.method = method

    def __str__(self) -> str:
        where = f"{self.method}: " if self.method else ""
        return f"{where}{self.code} {self.message}"

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before trying again, when the relay said (-32007), else ``None``."""
        if isinstance(self.data, dict):
            ms = self.data.get("retryAfterMs")
            if isinstance(ms, (int, float)) and not isinstance(ms, bool):
                return ms / 1000
        return None


class ConnectionClosed(ConnectionError):
    """The connection to the relay ended.

    A request that was waiting for its answer then has an unknown outcome (it may or may not
    have taken effect); nothing is sent again. ``reason`` says how the connection ended.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
