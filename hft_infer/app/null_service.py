"""The null service: answers every event at once, no model. Its tick-to-decision is the harness floor.

    python -m hft_infer.app.null_service [-c CONFIG] [--set K=V]... [--egress batch|per_instrument]
                                         [--delay-us D] [--run-dir DIR]

`hft-infer bench --null-service` / `--with-floor` (and `replay`) start it as
the service under test. It speaks to the harness exactly as `hft-infer serve`
does, from the same config: a SUB connected to `ingest.endpoint` with the same
topic subscriptions, an XPUB with XPUB_NODROP bound on `egress.endpoint`,
topic frames as configured, the same CPU placement (`[cpu]`, via
hft_infer.affinity), a Status on start, every `egress.status_interval_ms`
and a final one (`final = true`, `pending = 0`) after SIGTERM, once it has
drained the feed. What it leaves out is the work: per event it decodes only
the head of the message (instrument, seq, ts_send_ns; msgspec skips the
trailing fields), and per burst of frames (received until zmq.Again or
`ingest.max_drain`) it sends
- `--egress batch` (default): one DecisionBatch frame (topic ff ff ff fe),
  the columns packed with `array` (no numpy: its per-call cost is microseconds
  at burst sizes of 1-10);
- `--egress per_instrument`: one Decision per event on its instrument's topic.
Every answer is "decided" with action 0 and score 0.0. `--delay-us D` holds
each burst's answers until D µs after it was received (for tests of the
harness: the measured tick-to-decision must then be D plus the floor).

Polling follows `ingest.poll_mode` (busy: spin on recv; hybrid: spin for
`ingest.spin_budget_us`, then block; event: block), so that its floor is
measured under the same polling as the service it stands for. Framing is
checked by frame size (a topic frame is 4 bytes, a message is longer), not by
RCVMORE: pyzmq 27's getsockopt costs ~2 us per call on the dev VM.

Accounting: `received` counts events and rejected frames; undecodable frames
and single frames where a topic was expected are rejected (no answer: their
instrument is unknown); heartbeats and resets are not events.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from array import array
from collections import deque
from pathlib import Path

import msgspec
import numpy as np
import zmq

from hft_infer import channels
from hft_infer.affinity import apply_placement, configure_zmq_context, finish_warmup, plan_for_config
from hft_infer.channels import check_transports
from hft_infer.clock import perf_ns
from hft_infer.config import Config, ConfigError, load_config
from hft_infer.errors import UserError
from hft_infer.transport import sockets
from hft_infer.transport.codec import (
    BATCH_TOPIC,
    SERVICE_TOPIC,
    ReusableEncoder,
    event_batch_columns,
    feed_topics,
    shard_batch_topic,
    topic_for,
)
from hft_infer.transport.schema import (
    MAX_INSTRUMENT_ID,
    TAG_QUOTE,
    TAG_TRADE,
    Decision,
    DecisionBatch,
    EventBatch,
    Heartbeat,
    Reason,
    Reset,
    Status,
)
from hft_infer.transport.shm import ShmSubscriber

MODEL_VERSION = "null"
MAX_ANSWERS_PER_FRAME = 4096  # a DecisionBatch answering EventBatch bursts is cut into frames of this many
DRAIN_QUIET_NS = 100_000_000  # as the service: the feed is drained once silent this long
assert array("I").itemsize == 4 and array("Q").itemsize == 8 and array("q").itemsize == 8


class _QuoteHead(msgspec.Struct, tag=TAG_QUOTE, array_like=True, frozen=True, gc=False):
    """The first fields of a Quote; msgspec ignores the trailing ones (the book)."""

    instrument: int
    seq: int
    ts_exchange_ns: int
    ts_send_ns: int


class _TradeHead(msgspec.Struct, tag=TAG_TRADE, array_like=True, frozen=True, gc=False):
    instrument: int
    seq: int
    ts_exchange_ns: int
    ts_send_ns: int


SHM_TICK_S = 50e-6  # hybrid/event over iceoryx2, idle: look this often (no FD to block on)
_NB = int(zmq.NOBLOCK)
_MORE_NB = int(zmq.SNDMORE) | _NB


class NullService:
    def __init__(self, cfg: Config, ingest: zmq.Socket, egress: zmq.Socket, *, mode: str = "batch",
                 delay_us: float = 0.0) -> None:
        self.cfg = cfg
        self.ingest, self.egress = ingest, egress
        self.topic_in, self.topic_out = cfg.ingest.topic_frame, cfg.egress.topic_frame
        self.mode = mode
        self.delay_ns = int(delay_us * 1000)
        self.max_drain = cfg.ingest.max_drain
        self.poll_mode = cfg.ingest.poll_mode
        self.spin_budget_ns = cfg.ingest.spin_budget_us * 1000
        self.status_interval_ns = cfg.egress.status_interval_ms * 1_000_000
        self.decode = msgspec.msgpack.Decoder(_QuoteHead | _TradeHead | Heartbeat | Reset | EventBatch).decode
        self.encoder = ReusableEncoder()
        self.topics: dict[int, bytes] = {i: topic_for(i) for i in cfg.universe.owned_ids()}
        self.received = self.decided = self.rejected = self.dropped = self.heartbeats = self.resets = 0
        self.by_reason = [0] * (max(Reason) + 1)
        self.pending: deque = deque()  # (due_ns, instruments, seqs, ts_sends, ts_recv_ns) held by --delay-us
        self.n_pending = 0
        self.stopping = False
        if not isinstance(ingest, ShmSubscriber):
            self.poller = zmq.Poller()
            self.poller.register(ingest, zmq.POLLIN)

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)  # only flips state
        self.send_status()
        next_status = perf_ns() + self.status_interval_ns
        last_frame = perf_ns()
        while not self.stopping:
            got, now = self.read_and_answer()
            if got:
                last_frame = now
            if self.pending and self.pending[0][0] <= now:
                self.answer_due(now)
            if now >= next_status:
                self.send_status()
                next_status = now + self.status_interval_ns
            if not got and (self.poll_mode == "event" or
                            (self.poll_mode == "hybrid" and now - last_frame > self.spin_budget_ns)):
                wake = next_status if not self.pending else min(next_status, self.pending[0][0])
                self._wait(max(0, min(50, (wake - now) // 1_000_000 + 1)))
        self.drain_and_finish()

    def read_and_answer(self) -> tuple[int, int]:
        """Drain what is ready and answer (or hold) its events; (frames read, now)."""
        insts, seqs, sends, got = self.drain()
        now = perf_ns()
        if insts:
            self.answer_or_hold(insts, seqs, sends, now)
        return got, now

    def _wait(self, timeout_ms: int) -> None:
        self.poller.poll(timeout_ms)

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def drain(self):
        """Read up to ingest.max_drain frames: (instruments, seqs, ts_sends, frames read)."""
        recv, topic_in = self.ingest.recv, self.topic_in
        payloads = []
        add = payloads.append
        got = 0
        payload = None
        try:
            while got < self.max_drain:
                payload = None  # if the next recv raises Again, no frame of a message is pending
                payload = recv(_NB)
                got += 1
                if topic_in:
                    # a message where its topic should be (a topic is 4 bytes, a shard's batch topic 8)
                    if len(payload) != 4 and not (len(payload) == 8 and payload[:4] == BATCH_TOPIC):
                        self._reject(Reason.BAD_FRAMING)
                        continue
                    payload = recv(_NB)  # Again here: a lone topic frame at the end (below)
                    while len(payload) == 4:  # the topic before was a lone frame; this is the next topic
                        self._reject(Reason.BAD_FRAMING)
                        payload = recv(_NB)
                add(payload)
        except zmq.Again:
            if topic_in and payload is not None and len(payload) == 4:
                self._reject(Reason.BAD_FRAMING)  # a topic frame whose message never came
        return (*self._heads(payloads), got)

    def _heads(self, payloads: list) -> tuple[list, list, list]:
        """Decode the heads of a burst's messages: (instruments, seqs, ts_sends) of its events."""
        decode = self.decode
        insts, seqs, sends = [], [], []
        for payload in payloads:
            try:
                head = decode(payload)
            except msgspec.DecodeError:
                self._reject(Reason.DECODE_ERROR)
                continue
            kind = type(head)
            if kind is _QuoteHead or kind is _TradeHead:
                if head.seq < 0 or not 0 <= head.instrument <= MAX_INSTRUMENT_ID:
                    self._reject(Reason.BAD_FIELD)
                    continue
                insts.append(head.instrument)
                seqs.append(head.seq)
                sends.append(head.ts_send_ns if head.ts_send_ns >= 0 else 0)
            elif kind is EventBatch:  # many events: their heads from the columns
                cols = event_batch_columns(head)
                if cols is None:
                    self._reject(Reason.DECODE_ERROR)
                    continue
                insts.extend(cols["instrument"].tolist())
                seqs.extend(cols["seq"].tolist())
                sends.extend(np.maximum(cols["ts_send_ns"], 0).tolist())
            elif kind is Heartbeat:
                self.heartbeats += 1
            else:
                self.resets += 1
        self.received += len(insts)
        return insts, seqs, sends

    def _reject(self, reason: Reason) -> None:
        self.received += 1
        self.rejected += 1
        self.by_reason[reason] += 1

    def answer_or_hold(self, insts, seqs, sends, now: int) -> None:
        ts_recv = time.time_ns()  # one CLOCK_REALTIME read per burst, as the service stamps ts_recv_ns
        if self.delay_ns:
            self.pending.append((now + self.delay_ns, insts, seqs, sends, ts_recv))
            self.n_pending += len(insts)
        else:
            self.answer(insts, seqs, sends, ts_recv)

    def answer_due(self, now: int) -> None:
        while self.pending and self.pending[0][0] <= now:
            _, insts, seqs, sends, ts_recv = self.pending.popleft()
            self.n_pending -= len(insts)
            self.answer(insts, seqs, sends, ts_recv)

    def answer(self, insts, seqs, sends, ts_recv: int) -> None:
        n = len(insts)
        if self.mode == "batch" and n > MAX_ANSWERS_PER_FRAME:  # EventBatch bursts: frames of a bounded size
            for a in range(0, n, MAX_ANSWERS_PER_FRAME):
                b = a + MAX_ANSWERS_PER_FRAME
                self.answer(insts[a:b], seqs[a:b], sends[a:b], ts_recv)
            return
        if self.mode == "batch":
            zeros1, zeros4 = bytes(n), bytes(4 * n)
            frame = self.encoder.encode(DecisionBatch(
                time.time_ns(), MODEL_VERSION, n, array("I", insts).tobytes(), array("Q", seqs).tobytes(),
                zeros1, zeros1, zeros1, zeros4, zeros4, array("q", sends).tobytes(),
                array("q", (ts_recv,)).tobytes() * n))
            if not self._send(BATCH_TOPIC, frame):
                self.dropped += n
        else:
            encode, topics, now_ns = self.encoder.encode, self.topics, time.time_ns()
            for inst, seq, ts_send in zip(insts, seqs, sends):
                frame = encode(Decision(inst, seq, 0, 0, 0, 0.0, 0, ts_send, ts_recv, now_ns, MODEL_VERSION))
                topic = topics.get(inst)
                if not self._send(topic if topic is not None else topic_for(inst), frame):
                    self.dropped += 1
        self.decided += n

    def _send(self, topic: bytes, frame) -> bool:
        try:
            if self.topic_out:
                self.egress.send(topic, _MORE_NB)
            self.egress.send(frame, _NB)
        except zmq.Again:  # a subscriber's pipe is full (XPUB_NODROP): counted, never waited on
            return False
        return True

    # ------------------------------------------------------------ status and shutdown

    def status(self, final: bool = False) -> Status:
        pending = self.received - self.decided - self.rejected
        return Status(time.time_ns(), self.received, self.decided, 0, 0, self.rejected, pending, self.dropped, 0,
                      list(self.by_reason), final, "null", MODEL_VERSION)

    def send_status(self, final: bool = False) -> None:
        self._send(SERVICE_TOPIC, self.encoder.encode(self.status(final)))

    def drain_and_finish(self) -> None:
        """Read until the feed has been quiet for DRAIN_QUIET_NS (frames already sent may
        still be in libzmq's I/O thread), answer everything held, send the final Status."""
        deadline = perf_ns() + self.cfg.service.drain_timeout_ms * 1_000_000
        quiet_since = perf_ns()
        while perf_ns() < deadline and perf_ns() - quiet_since < DRAIN_QUIET_NS:
            got, now = self.read_and_answer()
            if got:
                quiet_since = now
            else:
                self._wait(5)
            self.answer_due(now)
        while self.pending:  # held answers: wait for their time, as promised
            self.answer_due(perf_ns())
            time.sleep(0.0005)
        self.send_status(final=True)

    def summary(self) -> dict:
        return {"accounting": {"received": self.received, "decided": self.decided, "shed": 0, "conflated": 0,
                               "rejected": self.rejected, "pending": self.received - self.decided - self.rejected},
                "egress_dropped": self.dropped, "heartbeats": self.heartbeats, "resets": self.resets,
                "rejected_by_reason": {r.name: self.by_reason[r] for r in Reason if self.by_reason[r]},
                "egress_mode": self.mode, "delay_us": self.delay_ns / 1000, "engine": "null"}


class ShmNullService(NullService):
    """The null service over iceoryx2 (channels.py picks it): each sample is one whole message
    (no topic frames); idle waits are short sleeps, as iceoryx2 gives no FD to block on."""

    def __init__(self, cfg: Config, ingest, egress, **kw) -> None:
        super().__init__(cfg, ingest, egress, **kw)
        self.topic_in = self.topic_out = False

    def _wait(self, timeout_ms: int) -> None:
        deadline = perf_ns() + timeout_ms * 1_000_000
        has = self.ingest.has_samples
        while not has() and perf_ns() < deadline and not self.stopping:
            time.sleep(SHM_TICK_S)

    def drain(self):
        payloads = self.ingest.recv_many(self.max_drain)
        return (*self._heads(payloads), len(payloads))

    def _send(self, topic: bytes, frame) -> bool:
        return self.egress.send(frame)  # DiscardData: False when a subscriber's buffer is full (counted)


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} null-service: {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hft_infer.app.null_service", description=__doc__.split("\n")[0])
    p.add_argument("-c", "--config", metavar="FILE")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--egress", choices=("batch", "per_instrument"), default="batch",
                   help="one DecisionBatch per burst (default) or one Decision per event")
    p.add_argument("--delay-us", type=float, default=0.0, help="answer each burst this long after receiving it")
    p.add_argument("--run-dir", metavar="DIR", help="where to write service.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.delay_us < 0:
            raise UserError("--delay-us must be >= 0")
        return serve(args)
    except (UserError, ConfigError, sockets.EndpointError, OSError) as e:
        print(f"null-service: error: {e}", file=sys.stderr)
        return 2


def serve(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    # the same placement as `serve` (its order and reasons: hft_infer/app/serve.py, affinity.py);
    # the GPU's PCI address is looked up without importing torch
    plan = plan_for_config(cfg, cfg.runner.device, use_torch=False)
    ctx = zmq.Context()
    report = apply_placement(plan, strict=cfg.cpu.strict, steps=[configure_zmq_context(ctx, plan)])
    check_transports(cfg)
    egr = channels.open_egress(cfg, ctx, curve=None)
    batch_topic = shard_batch_topic(cfg.universe.shard_index, cfg.universe.shard_count)
    topics = feed_topics(cfg.universe.owned_ids(), batch_topic) if cfg.ingest.topic_frame else None
    ing = channels.open_ingest(cfg, ctx, topics=topics, curve=None)
    ingest, ingest_ep, egress, egress_ep = ing.sock, ing.address, egr.sock, egr.address
    cls = ShmNullService if ing.shm or egr.shm else NullService
    if ing.shm != egr.shm:
        raise UserError("the null service needs ingest.transport and egress.transport to be the same")
    svc = cls(cfg, ingest, egress, mode=args.egress, delay_us=args.delay_us)
    finish_warmup(report, strict=cfg.cpu.strict)
    for line in report.log_block().splitlines():
        _log(line)
    _log(f"READY engine=null egress={args.egress} delay_us={args.delay_us:g} ingest={ingest_ep} "
         f"decisions={egress_ep} poll={cfg.ingest.poll_mode}")
    svc.run()
    summary = svc.summary()
    acc = summary["accounting"]
    print("accounting: " + ", ".join(f"{k}={v}" for k, v in acc.items()))
    if args.run_dir:
        Path(args.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.run_dir) / "service.json").write_text(json.dumps(summary, indent=2))
    ingest.close() if ing.shm else ingest.close(0)
    egress.close()  # zmq linger: the final answers and Status go out first
    ctx.term()
    return 0 if acc["pending"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
