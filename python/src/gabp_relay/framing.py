"""GABP's LSP-style framing: ``Content-Length: N\\r\\n`` (other headers allowed), a blank line,
then N bytes of UTF-8 JSON.

Owns turning messages into frames and frames back into bodies on an asyncio stream. It knows
nothing of requests, events or the relay: :mod:`gabp_relay.client` does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

#: The longest header block read before a frame is called broken.
MAX_HEADER_BYTES = 8 * 1024


class FramingError(Exception):
    """The peer's framing is broken: the stream cannot be read any further."""


def encode_body(message: Any) -> bytes:
    """``message`` as a frame's body: compact JSON, in ASCII (every other character escaped, as
    GABP peers write). NaN and infinities are refused here (``ValueError``): they are not JSON,
    and the relay would refuse the frame.
    """
    text = json.dumps(message, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.encode("ascii")


def frame(body: bytes) -> bytes:
    """``body`` framed: its ``Content-Length`` counts its bytes (not characters)."""
    return b"Content-Length: %d\r\nContent-Type: application/json\r\n\r\n" % len(body) + body


def content_length(header: bytes) -> int:
    """The ``Content-Length`` of a header block (names in any case, unknown headers ignored)."""
    length: int | None = None
    for line in header.split(b"\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            raise FramingError(f"a header line without a colon: {line[:80]!r}")
        if name.strip().lower() == b"content-length":
            text = value.strip()
            if not text.isdigit():
                raise FramingError(f"Content-Length is not a number: {text[:40]!r}")
            if length is not None and length != int(text):
                raise FramingError("two different Content-Length headers")
            length = int(text)
    if length is None:
        raise FramingError("a frame without Content-Length")
    return length


async def read_body(reader: asyncio.StreamReader, max_body: int) -> bytes | None:
    """The next frame's body, or ``None`` at a clean end of stream (between frames).

    Raises :class:`FramingError` for broken framing or a body over ``max_body`` bytes (checked
    before reading it), and ``asyncio.IncompleteReadError`` for a stream cut inside a frame.
    """
    try:
        header = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise
    except asyncio.LimitOverrunError as e:
        raise FramingError("a header block over the stream's limit") from e
    if len(header) > MAX_HEADER_BYTES:
        raise FramingError(f"a header block of {len(header)} bytes")
    length = content_length(header[:-4])
    if length > max_body:
        raise FramingError(f"a frame of {length} bytes, over the limit of {max_body}")
    return await reader.readexactly(length)
