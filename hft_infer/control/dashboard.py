"""The dashboard's HTTP side: one page, its assets, a WebSocket feed, /metrics.

Read-only by construction: every route is a GET; the WebSocket ignores what
the page sends. The page and its script ship in `hft_infer/control/static/`
and are loaded into memory at start (no path from a request ever reaches the
filesystem); the Content-Security-Policy forbids anything not from this
origin, so the page cannot fetch from the network even by mistake.

Two checks matter because the server listens on loopback where a browser can
be pointed at it by any web page:
- the Host header must name this server (defeats DNS rebinding, where
  evil.example resolves to 127.0.0.1 and its script reads our responses);
- a WebSocket's Origin, when present, must be this server's own origin
  (browsers do not apply the same-origin policy to WebSockets).

Each page gets frames through a one-slot mailbox: a page that reads slowly
skips frames instead of queueing them, so neither the process nor the page
grows with a slow client.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from importlib import resources
from urllib.parse import urlsplit

import msgspec
from aiohttp import WSCloseCode, WSMsgType, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hft_infer.control.aggregator import Aggregator

log = logging.getLogger("hft_infer.control")

MAX_CLIENTS = 32
_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_json = msgspec.json.Encoder()


def load_assets() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type) for every file in the package's static/ folder."""
    out = {}
    for entry in resources.files("hft_infer.control").joinpath("static").iterdir():
        ext = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and ext in _CONTENT_TYPES:
            out[entry.name] = (entry.read_bytes(), _CONTENT_TYPES[ext])
    if "index.html" not in out:
        raise RuntimeError("hft_infer/control/static/index.html is missing from the package")
    return out


class _Mailbox:
    """Latest frame and latest status for one page; older unsent ones are replaced."""

    __slots__ = ("frame", "status", "event")

    def __init__(self) -> None:
        self.frame: str | None = None
        self.status: str | None = None
        self.event = asyncio.Event()


class Broadcaster:
    def __init__(self) -> None:
        self.boxes: set[_Mailbox] = set()
        self.sockets: set[web.WebSocketResponse] = set()
        self.frames_skipped = 0

    async def close_all(self, app: web.Application | None = None) -> None:
        """At shutdown: open pages would otherwise hold the server's graceful stop
        for its whole timeout. They reconnect to the next control process."""
        for ws in list(self.sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"control process stopping")

    def publish_frame(self, frame: dict) -> None:
        if not self.boxes:
            return
        text = _json.encode(frame).decode()
        for box in self.boxes:
            if box.frame is not None:
                self.frames_skipped += 1
            box.frame = text
            box.event.set()

    def publish_status(self, status: dict) -> None:
        if not self.boxes:
            return
        text = _json.encode(status).decode()
        for box in self.boxes:
            box.status = text
            box.event.set()


def _loopback_name(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_of(value: str) -> str:
    return (urlsplit("//" + value).hostname or "").lower()


def build_app(agg: Aggregator, registry, broadcaster: Broadcaster, *, bind_host: str) -> web.Application:
    assets = load_assets()
    # Behind loopback only loopback names are genuine; on another address
    # (security.allow_remote) the operator's own names are unknown here.
    check_host = _loopback_name(bind_host) or bind_host in ("", "127.0.0.1", "::1")

    @web.middleware
    async def guard(request: web.Request, handler):
        if check_host and not _loopback_name(_host_of(request.host)):
            return web.Response(status=421, text="misdirected request: use http://127.0.0.1:<port>/\n")
        resp = await handler(request)
        resp.headers.setdefault("Content-Security-Policy", CSP)
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        resp.headers.setdefault("Referrer-Policy", "no-referrer")
        resp.headers.setdefault("Cache-Control", "no-store")
        return resp

    async def index(request: web.Request) -> web.Response:
        body, ctype = assets["index.html"]
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def static(request: web.Request) -> web.Response:
        item = assets.get(request.match_info["name"])
        if item is None:
            raise web.HTTPNotFound()
        return web.Response(body=item[0], headers={"Content-Type": item[1]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def frame(request: web.Request) -> web.Response:
        body = {"frame": agg.last_frame, "status": agg.status(time.time())}
        return web.Response(body=_json.encode(body), content_type="application/json")

    async def ws_handler(request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin and urlsplit(origin).netloc.lower() != request.host.lower():
            return web.Response(status=403, text="cross-origin WebSocket refused\n")
        if len(broadcaster.boxes) >= MAX_CLIENTS:
            return web.Response(status=503, text="too many dashboard clients\n")
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=4096)
        await ws.prepare(request)
        box = _Mailbox()
        broadcaster.boxes.add(box)
        broadcaster.sockets.add(ws)
        sender = asyncio.create_task(_send_loop(ws, box, agg))
        try:
            async for msg in ws:  # nothing the page says changes anything
                if msg.type == WSMsgType.ERROR:
                    break
        finally:
            broadcaster.boxes.discard(box)
            broadcaster.sockets.discard(ws)
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        return ws

    app = web.Application(middlewares=[guard], client_max_size=4096)
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/frame", frame)
    app.router.add_get("/ws", ws_handler)
    app.on_shutdown.append(broadcaster.close_all)
    return app


async def _send_loop(ws: web.WebSocketResponse, box: _Mailbox, agg: Aggregator) -> None:
    try:
        await ws.send_str(_json.encode(agg.hello()).decode())
        await ws.send_str(_json.encode(agg.status(time.time())).decode())
        while not ws.closed:
            await box.event.wait()
            box.event.clear()
            frame, status, box.frame, box.status = box.frame, box.status, None, None
            if frame is not None:
                await ws.send_str(frame)
            if status is not None:
                await ws.send_str(status)
    except (ConnectionResetError, RuntimeError) as e:  # page went away mid-send
        log.debug("dashboard client gone: %s", e)
