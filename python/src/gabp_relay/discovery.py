"""The bridge discovery file ``gabp-relay serve`` writes for each route: where the route listens
and its token, so a bridge needs neither flag.

Owns finding and reading that file (``$XDG_CONFIG_HOME/gabp-relay/bridge-ROUTE.json``, else
under ``~/.config``); it never writes one, and never connects.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BridgeFile:
    """What a discovery file says: the route's ``address`` (``HOST:PORT`` or ``unix:PATH``), its
    ``token``, and ``metadata`` (route, pid, start, launch id, relay version)."""

    address: str
    token: str
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def route(self) -> str | None:
        route = self.metadata.get("route")
        return route if isinstance(route, str) else None


def default_path(route: str = "default") -> Path:
    """Where ``serve`` writes route ``route``'s file (a ``/`` or ``%`` in the name escaped as
    ``%2F`` or ``%25``, as the relay does)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    name = route.replace("%", "%25").replace("/", "%2F")
    return Path(base) / "gabp-relay" / f"bridge-{name}.json"


def read_bridge_file(path: str | os.PathLike[str] | None = None, *,
                     route: str = "default") -> BridgeFile:
    """Reads a discovery file: ``path``, else route ``route``'s default one.

    Raises ``FileNotFoundError`` when there is none (no relay serves that route here) and
    ``ValueError`` when the file is not a discovery file.
    """
    p = Path(path) if path is not None else default_path(route)
    with open(p, "rb") as f:
        doc = json.load(f)
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: not a bridge discovery file (not a JSON object)")
    token = doc.get("token")
    transport = doc.get("transport")
    address = transport.get("address") if isinstance(transport, dict) else None
    if not isinstance(token, str) or not isinstance(address, str):
        raise ValueError(f"{p}: not a bridge discovery file (no token or transport.address)")
    meta = doc.get("metadata")
    return BridgeFile(address, token, meta if isinstance(meta, dict) else {}, p)
