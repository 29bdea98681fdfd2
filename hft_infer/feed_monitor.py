"""Watch the ingest socket's connection to the feed and restore it when libzmq will not.

libzmq drops a connection whose peer sent a message over ZMQ_MAXMSGSIZE and,
for a connecting socket, does not connect again (seen with ipc and libzmq
4.3.5: the SUB stays deaf; a publisher restart, by contrast, is reconnected by
libzmq itself). A socket monitor reports CONNECTED / DISCONNECTED; the loop
reads it every MONITOR_EVERY_NS (cold), counts every loss, logs it, and redoes
the connection (disconnect + connect: the SUB's subscriptions are sent again)
if libzmq has not restored it within RECONNECT_AFTER_NS.
"""

from __future__ import annotations

import zmq
import zmq.utils.monitor

MONITOR_EVERY_NS = 10_000_000
RECONNECT_AFTER_NS = 200_000_000


class FeedMonitor:
    def __init__(self, sock: zmq.Socket, endpoint: str, acct, log) -> None:
        self.sock = sock
        self.endpoint = endpoint
        self.acct = acct
        self.log = log
        self.monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.next_check_ns = 0
        self._disconnected_at = 0

    def check(self, now: int) -> None:
        if now < self.next_check_ns:
            return
        self.next_check_ns = now + MONITOR_EVERY_NS
        mon = self.monitor
        while mon.poll(0):
            ev = zmq.utils.monitor.recv_monitor_message(mon)
            if ev["event"] == zmq.EVENT_DISCONNECTED:
                self.acct.ingest_disconnects += 1
                self._disconnected_at = self._disconnected_at or now
                self.log(f"warning: feed connection lost ({self.endpoint}); reconnecting")
            elif ev["event"] == zmq.EVENT_CONNECTED:
                self._disconnected_at = 0
        if self._disconnected_at and now - self._disconnected_at > RECONNECT_AFTER_NS:
            try:
                self.sock.disconnect(self.endpoint)
            except zmq.ZMQError:
                pass  # already gone: connect again below
            self.sock.connect(self.endpoint)
            self._disconnected_at = now  # retry later unless CONNECTED arrives

    def close(self) -> None:
        self.monitor.close(0)
