"""The running control process: snapshots in, dashboard + /metrics + HDR logs out.

See process.py for how it is started and stopped; this module holds the
event-loop side.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import zmq
import zmq.asyncio
from aiohttp import web

from hft_infer.control.aggregator import Aggregator
from hft_infer.control.dashboard import Broadcaster, build_app
from hft_infer.control.exporter import build_registry
from hft_infer.control.settings import HLOG_FILE, URL_FILE, ControlSettings
from hft_infer.errors import UserError
from hft_infer.metrics.hlog import (
    IntervalLogWriter,
    merge_by_tag,
    read_hlog,
    write_hgrm,
)
from hft_infer.transport.sockets import bind

log = logging.getLogger("hft_infer.control")

RCV_HWM = 64  # snapshots: ~a minute at the default 1 s interval
MAX_SNAPSHOT_BYTES = 16 << 20  # libzmq drops (and disconnects) a peer sending more


class ControlProcess:
    def __init__(self, settings: ControlSettings) -> None:
        self.s = settings
        self.agg = Aggregator(history_points=settings.history_points)
        self.registry = build_registry(self.agg)
        self.broadcaster = Broadcaster()
        self.hlog = None
        self.url = ""
        self._stop = asyncio.Event()

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        s = self.s
        os.makedirs(s.run_dir, exist_ok=True)
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, RCV_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_SNAPSHOT_BYTES)
        sock.setsockopt(zmq.LINGER, 0)
        runner = None
        bound = False
        try:
            bind(sock, s.endpoint)  # EndpointError (one line) if another control process serves it
            bound = True
            if s.hlog:
                self._open_hlog()
            app = build_app(self.agg, self.registry, self.broadcaster, bind_host=s.host)
            # A short graceful stop: pages are closed by on_shutdown, and a
            # scrape in flight is worth at most a couple of seconds.
            runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
            await runner.setup()
            site = web.TCPSite(runner, s.host, s.port, reuse_address=True)
            try:
                await site.start()
            except OSError as e:
                raise UserError(f"cannot listen on {s.host}:{s.port}: {e.strerror}") from None
            port = runner.addresses[0][1]
            host = f"[{s.host}]" if ":" in s.host else s.host
            self.url = f"http://{host}:{port}/"
            self._write_url()
            log.info("dashboard %s  metrics %smetrics  snapshots from %s  run dir %s",
                     self.url, self.url, s.endpoint, s.run_dir)
            tasks = [asyncio.create_task(self._receive(sock)), asyncio.create_task(self._tick())]
            stop = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for t in done:
                if t is not stop and t.exception() is not None:
                    raise t.exception()
            stop.cancel()
            self._drain(sock)  # the final snapshot a stopping service sent just before us
            return 0
        finally:
            if runner is not None:
                await runner.cleanup()
            self._finish()
            sock.close(0)
            ctx.term()
            if bound:  # never another process's socket or URL after a failed start
                _remove_ipc_file(s.endpoint)

    def _open_hlog(self) -> None:
        path = os.path.join(self.s.run_dir, HLOG_FILE)
        if os.path.exists(path) and os.path.getsize(path) > 0:
            try:
                # Continue the run: cumulative histograms start from what is logged.
                self.agg.preload(merge_by_tag(read_hlog(path)))
            except Exception as e:  # noqa: BLE001 - a damaged log must not stop the dashboard
                log.warning("%s: not preloading cumulative histograms: %s", path, e)
        comment = f"hft-infer control process for service {self.s.service_name!r}; values in ns"
        self.hlog = IntervalLogWriter(path, comment=comment)

    def _write_url(self) -> None:
        path = os.path.join(self.s.run_dir, URL_FILE)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(self.url + "\n")
        os.replace(tmp, path)

    def _handle(self, raw: bytes) -> None:
        snap = self.agg.ingest(raw, time.time())
        if snap is None:
            if self.agg.snapshots_bad in (1, 10, 100, 1000) or self.agg.snapshots_bad % 10000 == 0:
                log.warning("bad snapshot #%d dropped: %s", self.agg.snapshots_bad, self.agg.last_bad_reason)
            return
        if self.hlog is not None:
            try:
                self.hlog.write_intervals(self.agg.fresh_intervals())
            except OSError as e:  # a full disk costs the log, not the dashboard
                log.error("%s: %s; interval log stopped", self.hlog.path, e.strerror)
                self.hlog = None
        self.broadcaster.publish_frame(self.agg.last_frame)
        if snap.final:
            log.info("service %s (pid %d) sent its final snapshot", snap.service, snap.pid)

    async def _receive(self, sock) -> None:
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 1:
                self.agg.snapshots_bad += 1
                self.agg.last_bad_reason = f"{len(frames)}-frame message"
                continue
            self._handle(frames[0])
            # Catch up without a trip through the event loop per message after a stall.
            self._drain(sock)

    def _drain(self, sock) -> None:
        """Handle what is queued now, without waiting."""
        for _ in range(RCV_HWM):
            # zmq.asyncio answers NOBLOCK with a finished future (result or zmq.Again).
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK).result()
            except zmq.Again:
                return
            if len(frames) == 1:
                self._handle(frames[0])
            else:
                self.agg.snapshots_bad += 1
                self.agg.last_bad_reason = f"{len(frames)}-frame message"

    async def _tick(self) -> None:
        """Liveness to the pages once a second, whether snapshots come or not."""
        while True:
            await asyncio.sleep(1.0)
            self.broadcaster.publish_status(self.agg.status(time.time()))

    def _finish(self) -> None:
        written = []
        for stage, st in self.agg.stages.items():
            if st.cumulative.total_count > 0:
                write_hgrm(st.cumulative, os.path.join(self.s.run_dir, f"{stage}.hgrm"))
                written.append(stage)
        if self.hlog is not None:
            self.hlog.close()
            self.hlog = None
        if self.url:  # ours: written once everything was bound
            try:
                os.unlink(os.path.join(self.s.run_dir, URL_FILE))
            except FileNotFoundError:
                pass
        if written:
            log.info("wrote %s.hgrm in %s", "/".join(written), self.s.run_dir)


def _remove_ipc_file(endpoint: str) -> None:
    """libzmq leaves a closed ipc socket's file behind; the next bind would have to
    probe it. Ours to remove: nobody else can have bound it while we held it."""
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        try:
            os.unlink(endpoint[len("ipc://"):])
        except OSError:
            pass
