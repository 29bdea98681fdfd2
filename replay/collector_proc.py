"""The collector process: receive decision-socket frames and timestamp them, nothing else.

    python -m hft_infer.replay.collector_proc --endpoint EP [--endpoint EP2]... --out FRAMES.npz
        [--subscribe HEX]... [--capacity N] [--core C] [--io-cores 1,2] [--spin] [--no-topic-frame]

Per frame it does two recv calls (topic, payload), one CLOCK_MONOTONIC read
right after the first, and two stores into preallocated lists; nothing is
decoded during the run (hft_infer.replay.collector decodes the file
afterwards). `--spin` busy-polls (a core of its own); without it the process
blocks in zmq_poll and is woken by the frame, which is what a machine without
spare cores can afford (the wake-up is part of what it measures).

Several `--endpoint`s (the decision sockets of several shards, `bench
--shards`): one SUB socket per endpoint, so that every frame is known by the
endpoint it came from (a Status carries no shard id); the conditions below
then hold for every endpoint, and --out also records each frame's endpoint
index (`load_sources`). An empty socket costs one failed recv per pass, so
one collector serves a few shards, not dozens.

`--endpoint iceoryx2:SERVICE`: an iceoryx2 subscriber (transport/shm.py, buffer
`--shm-buffer`) instead of a SUB; one sample is one message. Without --spin it
sleeps in SHM_TICK_S steps between looks (iceoryx2 gives no FD to block on).

Replies on stdout (replay.child): `ready` when the first Status arrives (the
subscription has reached the service, so no later decision can be missed);
then, on command,
- `quiet Q T`:  replies `quiet` once no frame has come for Q s (`quiet timeout` after T s);
- `quiet Q T settled`: the same, once also the newest Status on every endpoint came after the
                command and says `pending = 0`: a service that someone else started and that keeps
                running (so no final Status accounts for what it still holds) may sit on events for
                longer than Q (a slow step, `runner.cpu_worker`) without sending anything;
- `final T`:    replies `final` once a Status with final = true has come (`final timeout`);
- `status T`:   replies `status` once a Status newer than the command has come;
- `stop`:       writes every frame and its receive time to --out, replies `done N`, exits.
Commands are read between bursts (at most every ~1 ms while spinning).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import zmq

from hft_infer.clock import perf_ns
from hft_infer.replay.child import Commands, log, parse_cores, pin_self, reply, set_timer_slack, zmq_context
from hft_infer.transport.codec import EgressDecoder, message_tag
from hft_infer.transport.schema import TAG_STATUS, Status
from hft_infer.transport.shm import ShmSubscriber, service_of
from hft_infer.transport.sockets import SUB_SNDHWM, connect

COMMAND_CHECK_NS = 1_000_000
SHM_TICK_S = 20e-6  # blocking over iceoryx2 (no FD): how often it looks for samples
CHECK_EVERY_FRAMES = 1024  # a busy stream never raises Again: look at the commands anyway


def save_frames(path: str, frames: list, recv_ns: list, source: np.ndarray | None = None) -> None:
    lengths = np.fromiter((len(f) for f in frames), dtype=np.uint32, count=len(frames))
    np.savez(path, recv_ns=np.asarray(recv_ns, dtype=np.int64), payload_len=lengths,
             payload_blob=np.frombuffer(b"".join(frames), dtype=np.uint8),
             source=np.zeros(len(frames), np.uint16) if source is None else source.astype(np.uint16))


def load_sources(path: str) -> np.ndarray:
    """Per frame of `load_frames(path)`: the index of the --endpoint it came from."""
    with np.load(path) as z:
        return z["source"].astype(np.int64) if "source" in z.files else np.zeros(z["recv_ns"].size, np.int64)


def load_frames(path: str) -> tuple[list[bytes], np.ndarray]:
    """(payloads, receive times in perf_counter_ns) written by a collector process."""
    with np.load(path) as z:
        data = z["payload_blob"].tobytes()
        ends = np.cumsum(z["payload_len"], dtype=np.int64).tolist()
        return [data[a:b] for a, b in zip([0] + ends[:-1], ends)], z["recv_ns"].copy()


class Receiver:
    def __init__(self, sock: zmq.Socket, *, topic_frame: bool, capacity: int) -> None:
        self.sock = sock
        self.topic_frame = topic_frame
        self.frames: list = [None] * capacity
        self.times: list = [0] * capacity
        self.n = 0
        self.status_at: list[int] = []  # indices of Status frames (by their tag byte)
        self.decode = EgressDecoder().decode

    def drain(self) -> None:
        """Receive until the socket is empty or CHECK_EVERY_FRAMES frames have come."""
        recv, nb, topic_frame = self.sock.recv, int(zmq.NOBLOCK), self.topic_frame
        frames, times, status_at = self.frames, self.times, self.status_at
        n = self.n
        limit = min(len(frames), n + CHECK_EVERY_FRAMES)
        try:
            while n < limit:
                first = recv(nb)
                t = perf_ns()
                payload = recv(nb) if topic_frame else first
                frames[n] = payload
                times[n] = t
                # Status frames are rare and looked at by the commands
                if message_tag(payload) == TAG_STATUS:
                    status_at.append(n)
                n += 1
        except zmq.Again:
            pass
        self.n = n
        if n == len(frames):  # grow (cold): a run with more frames than the capacity guessed
            frames.extend([None] * len(frames))
            times.extend([0] * len(times))

    def drain_shm(self) -> None:
        """`drain` over iceoryx2 (transport/shm.py): one sample is one whole message."""
        recv = self.sock.recv
        frames, times, status_at = self.frames, self.times, self.status_at
        n = self.n
        limit = min(len(frames), n + CHECK_EVERY_FRAMES)
        while n < limit:
            payload = recv()
            if payload is None:
                break
            frames[n] = payload
            times[n] = perf_ns()
            if message_tag(payload) == TAG_STATUS:
                status_at.append(n)
            n += 1
        self.n = n
        if n == len(frames):
            frames.extend([None] * len(frames))
            times.extend([0] * len(times))

    def status(self, i: int) -> Status | None:
        try:
            msg = self.decode(self.frames[i])
        except Exception:  # noqa: BLE001 - a garbled frame is no Status
            return None
        return msg if isinstance(msg, Status) else None


def settled(r: Receiver, first: int) -> bool:
    """Has a Status come since r.status_at[first], and does the newest one say nothing is pending?"""
    if len(r.status_at) <= first:
        return False
    newest = r.status(r.status_at[-1])
    return newest is not None and newest.pending == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="collector_proc")
    ap.add_argument("--endpoint", action="append", required=True,
                    help="repeatable: one SUB socket each (iceoryx2:SERVICE: an iceoryx2 subscriber)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--subscribe", action="append", default=None, metavar="HEX",
                    help="topic prefix in hex (repeatable; default: everything)")
    ap.add_argument("--capacity", type=int, default=1 << 16)
    ap.add_argument("--core", type=int, default=None)
    ap.add_argument("--io-cores", default="")
    ap.add_argument("--spin", action="store_true")
    ap.add_argument("--no-topic-frame", action="store_true")
    ap.add_argument("--shm-buffer", type=int, default=4096, help="iceoryx2: this subscriber's buffer (frames)")
    a = ap.parse_args(argv)
    set_timer_slack()
    ctx = zmq_context(parse_cores(a.io_cores))
    placed = pin_self(a.core)
    socks = []
    for endpoint in a.endpoint:
        service = service_of(endpoint)
        if service is not None:
            socks.append(ShmSubscriber(service, buffer=a.shm_buffer, role="collector"))
            continue
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, 0)  # never drop: a slow collector must show, not lose
        sock.setsockopt(zmq.SNDHWM, SUB_SNDHWM)  # every subscription reaches the service (sockets.py)
        sock.setsockopt(zmq.LINGER, 0)
        for topic in a.subscribe if a.subscribe is not None else [""]:
            sock.setsockopt(zmq.SUBSCRIBE, bytes.fromhex(topic))
        connect(sock, endpoint)
        socks.append(sock)
    log(f"collector: {'spin' if a.spin else 'block'}, {placed}, io cores {a.io_cores or '-'}, "
        f"{len(a.subscribe) if a.subscribe is not None else 'all'} topic(s), {len(socks)} endpoint(s)")
    capacity = max(a.capacity // len(socks), 1024)
    rxs = [Receiver(sock, topic_frame=not a.no_topic_frame, capacity=capacity) for sock in socks]
    for r in rxs:
        if isinstance(r.sock, ShmSubscriber):
            r.drain = r.drain_shm
    shm = [r.sock for r in rxs if isinstance(r.sock, ShmSubscriber)]
    rx = rxs[0]
    commands = Commands()
    poller = zmq.Poller()
    for sock in socks:
        if not isinstance(sock, ShmSubscriber):
            poller.register(sock, zmq.POLLIN)
    poller.register(commands.fd, zmq.POLLIN)
    ready = False
    waiting = None  # (what, argument, deadline_ns) of the command being answered
    next_check = 0
    while True:
        if len(rxs) == 1:
            rx.drain()
        else:
            for r in rxs:
                r.drain()
        now = perf_ns()
        if now < next_check:
            if a.spin:
                continue
            # blocking: sleep in zmq_poll until a frame, a command or the next check is due
            timeout_ms = 10 if waiting is not None and waiting[0] == "quiet" else 100
            if shm:  # iceoryx2 has no FD: look at the samples every SHM_TICK_S until a check is due
                events = {}
                while not any(s.has_samples() for s in shm) and perf_ns() < next_check:
                    time.sleep(SHM_TICK_S)
                    if poller.poll(0):
                        events = {commands.fd: 1}
                        break
            else:
                events = dict(poller.poll(timeout_ms))
            if events and commands.fd not in events or shm and not events:
                continue
            now = perf_ns()
        next_check = now + COMMAND_CHECK_NS  # also while frames never stop coming
        lines = commands.poll(0)
        if not ready and all(r.status_at for r in rxs):
            reply("ready")
            ready = True
        for line in lines:
            words = line.split()
            if words[0] == "stop":
                n = sum(r.n for r in rxs)
                save_frames(a.out, sum((r.frames[:r.n] for r in rxs), []), sum((r.times[:r.n] for r in rxs), []),
                            np.repeat(np.arange(len(rxs)), [r.n for r in rxs]))
                reply("done", n)
                log(f"collector: {n} frames")
                return 0
            if words[0] == "exit":
                return 0
            if words[0] == "quiet":
                # quiet since the later of the last frame and the command; settled: the Statuses from
                # len(status_at) on (per endpoint) are the ones that came after the command
                first_status = [len(r.status_at) for r in rxs] if words[3:4] == ["settled"] else None
                waiting = ("quiet", (now, int(float(words[1]) * 1e9), first_status),
                           now + int(float(words[2]) * 1e9))
            elif words[0] == "final":
                # arg: per endpoint, the first Status not yet looked at (-1: its final one has come)
                waiting = ("final", [0] * len(rxs), now + int(float(words[1]) * 1e9))
            elif words[0] == "status":
                waiting = ("status", [r.n for r in rxs], now + int(float(words[1]) * 1e9))
        if commands.eof:
            return 0
        if waiting is not None:
            what, arg, deadline = waiting
            if what == "quiet":
                since, quiet_ns, first_status = arg
                done = now - max([since] + [r.times[r.n - 1] for r in rxs if r.n]) >= quiet_ns
                if done and first_status is not None:
                    done = all(settled(r, first) for r, first in zip(rxs, first_status))
            elif what == "final":
                for k, r in enumerate(rxs):  # look at each Status once
                    if arg[k] >= 0:
                        got = any((s := r.status(i)) is not None and s.final for i in r.status_at[arg[k]:])
                        arg[k] = -1 if got else len(r.status_at)
                done = all(x < 0 for x in arg)
            else:
                done = all(any(i >= first for i in r.status_at) for r, first in zip(rxs, arg))
            if done or now > deadline:
                reply(what if done else f"{what} timeout")
                waiting = None


if __name__ == "__main__":
    sys.exit(main())
