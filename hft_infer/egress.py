"""Decision and Status publishing: encode into a reused buffer, send without blocking.

The socket is an XPUB with XPUB_NODROP (transport/sockets.py says why): a
send that meets a full subscriber pipe raises zmq.Again, which is counted in
`dropped` and never waited on. Topic frames (4-byte instrument id, or
0xFFFFFFFF for Status) are precomputed per slot.
"""

from __future__ import annotations

import zmq

from hft_infer.transport.codec import SERVICE_TOPIC, ReusableEncoder, topic_for
from hft_infer.transport.schema import Decision, Status

_MORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)  # plain ints: enum flags cost an enum per send
_NOBLOCK = int(zmq.NOBLOCK)


class DecisionPublisher:
    def __init__(self, sock: zmq.Socket, instrument_ids: list[int], *, topic_frame: bool,
                 model_version: str) -> None:
        self.sock = sock
        self.topic_frame = topic_frame
        self.topics = [topic_for(i) for i in instrument_ids]
        self.model_version = model_version
        self._encoder = ReusableEncoder()
        self.sent = 0
        self.dropped = 0

    def send_decision(self, slot: int, instrument: int, seq: int, status: int, reason: int, action: int,
                      score: float, n_conflated: int, ts_send_ns: int, ts_recv_ns: int,
                      ts_decision_ns: int) -> bool:
        buf = self._encoder.encode(Decision(instrument, seq, status, reason, action, score, n_conflated,
                                            ts_send_ns, ts_recv_ns, ts_decision_ns, self.model_version))
        return self._send(self.topics[slot] if slot >= 0 else topic_for(instrument), buf)

    def send_status(self, status: Status) -> bool:
        return self._send(SERVICE_TOPIC, self._encoder.encode(status))

    def _send(self, topic: bytes, payload) -> bool:
        sock = self.sock
        try:
            if self.topic_frame:
                sock.send(topic, _MORE_NOBLOCK)
            sock.send(payload, _NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        self.sent += 1
        return True
