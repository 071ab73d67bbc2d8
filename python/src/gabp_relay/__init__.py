"""A Python client for gabp-relay: a GABP bridge on asyncio, and a reader of the relay's exports.

Modules: ``client`` (the connection: hello, requests, subscriptions, resume), ``framing`` (GABP's
``Content-Length`` frames), ``model`` (events, tools, marks, leases, resume points), ``errors``
(:class:`GabpError`, :class:`ConnectionClosed`, the relay's error codes), ``discovery`` (the
bridge file ``serve`` writes) and ``export`` (rows of ``gabp-relay export``).

    import asyncio, gabp_relay

    async def main() -> None:
        async with gabp_relay.connect(name="my-agent") as c:   # the default route's bridge file
            print([t.name for t in await c.list_tools()])
            sub = await c.subscribe(["world/tick"])
            async for event in sub:
                print(event.channel, event.seq, event.payload)

    asyncio.run(main())

Standard library only; Python 3.10 or newer.
"""

from .client import DEFAULT_MAX_QUEUE, Client, Connecting, Subscription, __version__, connect
from .discovery import BridgeFile, default_path, read_bridge_file
from .errors import ConnectionClosed, ErrorCode, GabpError
from .export import ExportRow, export_rows, read_export
from .model import Event, Lease, Mark, ResumePoint, Tool

__all__ = [
    "DEFAULT_MAX_QUEUE",
    "BridgeFile",
    "Client",
    "Connecting",
    "ConnectionClosed",
    "ErrorCode",
    "Event",
    "ExportRow",
    "GabpError",
    "Lease",
    "Mark",
    "ResumePoint",
    "Subscription",
    "Tool",
    "__version__",
    "connect",
    "default_path",
    "export_rows",
    "read_bridge_file",
    "read_export",
]
