"""Reading ``gabp-relay export`` JSON lines (docs/reference/export-schema.md): one row per
recorded frame, as :class:`ExportRow`.

Owns parsing rows, from a file, a stream, or a ``gabp-relay export`` run as a child process.
It never opens a data dir itself: the relay's ``export`` is the one reader of recordings.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any


@dataclass(frozen=True, slots=True)
class ExportRow:
    """One recorded frame. ``dir`` is ``bridge->relay``, ``relay->mod``, ``mod->relay`` or
    ``relay->bridge``; ``kind`` is ``request``, ``response``, ``event``, ``mark`` or ``other``;
    ``conn`` the bridge's connection (0: the mod's own traffic). ``msg`` is the frame itself
    (``None`` for a frame that was no valid JSON when received: its text is ``raw``).
    ``label`` and ``data`` are a mark's (mark rows only). ``line`` is the whole line as read.
    """

    session: str
    frame: int
    t_ns: int
    offset_ms: float
    dir: str
    conn: int
    kind: str
    channel: str | None
    mod_seq: int | None
    relay_seq: int | None
    tags: dict[str, str]
    msg: Any
    raw: str | None
    label: str | None
    data: Any
    line: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, line: dict[str, Any]) -> ExportRow:
        tags = line.get("tags")
        return cls(
            session=str(line["session"]),
            frame=int(line["frame"]),
            t_ns=int(line["tNs"]),
            offset_ms=float(line["offsetMs"]),
            dir=str(line["dir"]),
            conn=int(line["conn"]),
            kind=str(line["kind"]),
            channel=line.get("channel"),
            mod_seq=line.get("modSeq"),
            relay_seq=line.get("relaySeq"),
            tags=tags if isinstance(tags, dict) else {},
            msg=line.get("msg"),
            raw=line.get("raw"),
            label=line.get("label"),
            data=line.get("data"),
            line=line,
        )

    def _field(self, name: str) -> Any:
        return self.msg.get(name) if isinstance(self.msg, dict) else None

    @property
    def method(self) -> str | None:
        """A request's method (a mark's is ``relay/mark``)."""
        m = self._field("method")
        return m if isinstance(m, str) else None

    @property
    def id(self) -> str | None:
        """The message id: a request and its response share it (per connection)."""
        i = self._field("id")
        return i if isinstance(i, str) else None

    @property
    def payload(self) -> Any:
        """A request's params, a response's result or error, an event's payload."""
        if not isinstance(self.msg, dict):
            return None
        for key in ("params", "payload", "result", "error"):
            if key in self.msg:
                return self.msg[key]
        return None

    @property
    def episode(self) -> int | None:
        """The episode the frame lies in, numbered from 1 in its session (``None`` outside any)."""
        e = self.line.get("episode")
        return e if isinstance(e, int) and not isinstance(e, bool) else None

    @property
    def error_code(self) -> int | None:
        """An error response's code."""
        err = self._field("error")
        code = err.get("code") if isinstance(err, dict) else None
        return code if isinstance(code, int) else None


Source = str | os.PathLike[str] | IO[str] | IO[bytes] | Iterable[str] | Iterable[bytes]


def read_export(source: Source, *,
                parse_float: Callable[[str], Any] | None = None) -> Iterator[ExportRow]:
    """The rows of a JSONL export, lazily, one at a time (memory stays flat whatever its size).

    ``source`` is a path, an open file (text or binary, ``sys.stdin`` too) or any iterable of
    lines. Integers of any size are exact (Python's); pass ``parse_float=decimal.Decimal`` for
    exact decimals too. A line that is not a row raises ``ValueError`` naming its number.
    """
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            yield from _rows(f, parse_float)
    else:
        yield from _rows(source, parse_float)


def _rows(lines: Iterable[str | bytes],
          parse_float: Callable[[str], Any] | None) -> Iterator[ExportRow]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line, parse_float=parse_float)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            yield ExportRow.from_json(doc)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"export line {n}: not an export row ({e!r})") from e


def export_rows(*args: str, binary: str = "gabp-relay",
                parse_float: Callable[[str], Any] | None = None) -> Iterator[ExportRow]:
    """Runs ``gabp-relay export ARGS… -o -`` and yields its rows as they are written, e.g.
    ``export_rows("latest", "--data-dir", "gabp-data", "--from-mark", "episode-start")``.

    Raises ``RuntimeError`` with the command's error line if it fails (exit 1: nothing matched;
    2: a usage error).
    """
    cmd = [binary, "export", *args, "-o", "-"]
    # Its error lines go to a file: a pipe nobody reads while rows stream could fill and stall it.
    with tempfile.TemporaryFile() as err, \
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err) as child:
        assert child.stdout is not None
        try:
            yield from _rows(child.stdout, parse_float)
        finally:
            child.stdout.close()
            code = child.wait()
        if code != 0:
            err.seek(0)
            text = err.read().decode("utf-8", "replace").strip()
            raise RuntimeError(f"{' '.join(cmd)} exited {code}: {text}")
