"""Capture files: exact round trip, counts from headers, crash recovery, decoding to events."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hft_infer.replay import capture_format as fmt
from hft_infer.replay.capture import (
    CaptureError,
    CaptureWriter,
    capture_info,
    decode_events,
    read_capture,
    to_events,
    write_capture,
)
from hft_infer.replay.events import KIND_QUOTE, KIND_TRADE, empty_events, encode_frames
from hft_infer.transport.codec import encode
from hft_infer.transport.schema import Heartbeat


def _messages(n: int, seed: int = 0) -> list[tuple[bytes, ...]]:
    """Messages of 1-3 frames, including an empty frame and one larger than zmq's copy threshold."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = 1 + i % 3
        out.append(tuple(rng.bytes(int(rng.integers(0, 300))) for _ in range(k)))
    out[1] = (b"\x00\x00\x00\x07", b"")
    out[2] = (b"\x00\x00\x00\x08", rng.bytes(70_000))
    return out


def _write(path, n=50, flush_records=7, **kw):
    msgs = _messages(n)
    ts = (1_700_000_000_000_000_000 + np.cumsum(np.arange(n) % 5)).tolist()
    write_capture(path, ts, msgs, flush_records=flush_records, **kw)
    return ts, msgs


def test_round_trip_is_exact(tmp_path):
    p = tmp_path / "a.cap"
    ts, msgs = _write(p, endpoint="ipc:///tmp/feed.sock")
    c = read_capture(p)
    assert len(c) == 50 and c.n_frames == sum(map(len, msgs))
    assert c.recv_ts_ns.tolist() == ts
    assert c.messages() == msgs
    assert [c.frames(i) for i in range(50)] == msgs
    assert c.payloads() == [m[-1] for m in msgs]
    assert c.clean and c.problems == [] and c.lost_bytes == 0 and c.blocks == 8  # ceil(50 / 7)
    assert c.header.endpoint == "ipc:///tmp/feed.sock" and c.header.topic_frame


def test_uniform_frame_counts_take_the_fast_path(tmp_path):
    p = tmp_path / "u.cap"
    msgs = [(b"\x00\x00\x00\x01", b"p%d" % i) for i in range(10)]
    write_capture(p, range(10), msgs, topic_frame=False)
    c = read_capture(p)
    assert c.messages() == msgs and not c.header.topic_frame


def test_info_counts_from_trailer_and_from_block_headers_agree(tmp_path):
    p = tmp_path / "a.cap"
    ts, msgs = _write(p)
    fast = capture_info(p)
    walked = capture_info(p, verify=True)
    for key in ("records", "frames", "blocks", "first_recv_ns", "last_recv_ns", "frame_bytes", "clean"):
        assert fast[key] == walked[key], key
    assert fast["records"] == 50 and fast["frames"] == sum(map(len, msgs))
    assert fast["frame_bytes"] == sum(len(f) for m in msgs for f in m)
    assert (fast["first_recv_ns"], fast["last_recv_ns"]) == (ts[0], ts[-1])
    assert fast["duration_s"] == (ts[-1] - ts[0]) / 1e9 and fast["file_bytes"] == os.path.getsize(p)


def test_empty_capture(tmp_path):
    p = tmp_path / "e.cap"
    CaptureWriter(p).close()
    c = read_capture(p)
    assert len(c) == 0 and c.clean and c.messages() == []
    assert capture_info(p)["records"] == 0 and capture_info(p, verify=True)["records"] == 0
    assert to_events(c).shape == (0,)


def _block_offsets(path) -> list[int]:
    """Start of every block and of the trailer, walking the headers by hand."""
    data = open(path, "rb").read()
    pos = fmt.decode_header(data, path).size
    out = []
    while pos < len(data):
        out.append(pos)
        if data[pos:pos + 4] == fmt.TRAILER_MAGIC:
            break
        pos += fmt.BLOCK.size + fmt.BLOCK.unpack_from(data, pos)[3]
    return out


def _cut_points(path):
    offs = _block_offsets(path)
    last_block, trailer = offs[-2], offs[-1]
    return {
        "mid-trailer": (trailer + 10, 50),
        "trailer-gone": (trailer, 50),
        "mid-last-block-payload": (last_block + fmt.BLOCK.size + 20, 49),
        "mid-last-block-header": (last_block + 17, 49),
        "last-block-magic-only": (last_block + 2, 49),
    }


@pytest.mark.parametrize("where", ["mid-trailer", "trailer-gone", "mid-last-block-payload",
                                   "mid-last-block-header", "last-block-magic-only"])
def test_a_torn_tail_loses_only_the_last_block(tmp_path, where):
    p = tmp_path / "a.cap"
    ts, msgs = _write(p)
    cut, keep = _cut_points(p)[where]  # blocks of 7: the last block holds record 50 alone
    os.truncate(p, cut)
    c = read_capture(p)
    assert not c.clean
    assert len(c) == keep and c.messages() == msgs[:keep] and c.recv_ts_ns.tolist() == ts[:keep]
    info = capture_info(p)
    assert info["records"] == keep and not info["clean"]
    if where == "trailer-gone":  # ends exactly on a block boundary: nothing lost, nothing to report
        assert c.problems == [] and c.lost_bytes == 0
    else:
        assert len(c.problems) == 1 and c.lost_bytes > 0 and info["problems"] == c.problems
    if where == "mid-last-block-payload":  # the header was intact, so the loss is known exactly
        assert "1 record(s) lost" in c.problems[0] and c.lost_records == 1


def test_a_corrupt_block_in_the_middle_is_skipped_and_the_rest_kept(tmp_path):
    p = tmp_path / "a.cap"
    ts, msgs = _write(p)
    second = _block_offsets(p)[1]
    with open(p, "r+b") as f:
        f.seek(second + fmt.BLOCK.size + 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    c = read_capture(p)
    assert len(c) == 43 and c.messages() == msgs[:7] + msgs[14:]
    assert c.lost_records == 7 and "fails its CRC: 7 record(s) skipped" in c.problems[0]
    # the fast info path trusts the trailer; verify=True finds the damage
    assert capture_info(p)["records"] == 50
    v = capture_info(p, verify=True)
    assert v["records"] == 43 and v["lost_records"] == 7


def test_a_damaged_block_header_stops_the_reader_there(tmp_path):
    p = tmp_path / "a.cap"
    _, msgs = _write(p)
    third = _block_offsets(p)[2]
    with open(p, "r+b") as f:
        f.seek(third + 5)  # inside n_records: the header CRC catches it
        f.write(b"\xff")
    c = read_capture(p)
    assert c.messages() == msgs[:14]
    assert "block header CRC mismatch" in c.problems[0] and "unreadable" in c.problems[0]


def test_append_resumes_after_a_crash(tmp_path):
    p = tmp_path / "a.cap"
    _, msgs = _write(p)
    os.truncate(p, _cut_points(p)["mid-last-block-payload"][0])
    more = [(b"\x00\x00\x00\x09", b"after %d" % i) for i in range(5)]
    with CaptureWriter(p, append=True) as w:
        assert w.records == 49
        for i, m in enumerate(more):
            w.add(2_000_000_000_000_000_000 + i, m)
    c = read_capture(p)
    assert c.clean and c.problems == [] and c.messages() == msgs[:49] + more
    assert capture_info(p)["records"] == 54


def test_writer_refuses_to_overwrite_unless_told(tmp_path):
    p = tmp_path / "a.cap"
    _write(p)
    with pytest.raises(FileExistsError):
        CaptureWriter(p)
    CaptureWriter(p, overwrite=True).close()
    assert capture_info(p)["records"] == 0


def test_timed_flush_writes_a_block_without_waiting_for_a_full_one(tmp_path):
    p = tmp_path / "t.cap"
    w = CaptureWriter(p, flush_records=1000, flush_ms=50)
    w.add(1, (b"a",))
    assert w.flush_due_ns is not None
    assert not w.flush_if_due(w.flush_due_ns - 1)
    assert capture_info(p)["records"] == 0
    assert w.flush_if_due(w.flush_due_ns)
    assert capture_info(p)["records"] == 1 and w.flush_due_ns is None  # readable while still open
    w.close()


def test_byte_limit_flushes_a_block(tmp_path):
    p = tmp_path / "b.cap"
    w = CaptureWriter(p, flush_records=1000, flush_bytes=1000)
    w.add(1, (b"x" * 600,))
    assert w.blocks == 0
    w.add(2, (b"x" * 600,))
    assert w.blocks == 1 and w.pending == 0
    w.close()


@pytest.mark.parametrize("mangle, match", [
    (lambda d: b"hello world, not a capture" + d, "not a capture file"),
    (lambda d: d.replace(b"\r\n", b"\n", 1), "damaged"),
    (lambda d: d[:8] + b"\x02\x00" + d[10:], "version 2 is not supported"),
    (lambda d: d[:30] + bytes([d[30] ^ 1]) + d[31:], "header CRC mismatch"),
    (lambda d: d[:20], "truncated"),
])
def test_not_a_capture_is_a_clear_error(tmp_path, mangle, match):
    p = tmp_path / "a.cap"
    _write(p)
    p.write_bytes(mangle(p.read_bytes()))
    with pytest.raises(CaptureError, match=match):
        read_capture(p)
    with pytest.raises(CaptureError, match=match):
        capture_info(p)


def _session(levels: int = 3) -> np.ndarray:
    """A small hand-built event table: quotes of 1..levels levels and trades, 3 instruments."""
    ev = empty_events(12, levels)
    rng = np.random.default_rng(5)
    for i in range(12):
        ev[i]["ts_exchange_ns"] = 1_000 + 10 * i
        ev[i]["instrument"] = i % 3
        ev[i]["seq"] = i // 3
        if i % 4 == 3:
            ev[i]["kind"] = KIND_TRADE
            ev[i]["price"] = 100.0 + i / 8
            ev[i]["size"] = 1 + i
            ev[i]["side"] = 1 if i % 2 else -1
            ev[i]["priority"] = i % 2
        else:
            ev[i]["kind"] = KIND_QUOTE
            n = 1 + i % levels
            ev[i]["n_levels"] = n
            ev[i]["book"][:n] = (rng.random((n, 4)) * 100).astype(np.float32)
    return ev


def test_decode_events_reproduces_the_event_table(tmp_path):
    ev = _session()
    frames = encode_frames(ev)
    hb = (b"\xff\xff\xff\xff", encode(Heartbeat(123, "pub")))
    msgs = [hb] + frames[:5] + [hb, (b"\x00\x00\x00\x01", b"\xc1 not msgpack")] + frames[5:]
    p = tmp_path / "s.cap"
    write_capture(p, range(len(msgs)), msgs)
    d = decode_events(read_capture(p))
    np.testing.assert_array_equal(d.events, ev)
    assert d.heartbeats == 2 and d.undecodable == 1
    assert d.record_index.tolist() == [1, 2, 3, 4, 5] + list(range(8, 15))
    # levels: cut to 1 keeps the best level; padded to 5 adds zeros
    one = to_events(read_capture(p), levels=1)
    np.testing.assert_array_equal(one["book"][:, 0], ev["book"][:, 0])
    assert one["n_levels"].max() == 1
    five = to_events(read_capture(p), levels=5)
    np.testing.assert_array_equal(five["book"][:, :3], ev["book"])
    assert not five["book"][:, 3:].any()


def test_info_module_entry_point(tmp_path):
    p = tmp_path / "a.cap"
    _write(p)
    r = subprocess.run([sys.executable, "-m", "hft_infer.replay.capture", str(p), "--verify"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["records"] == 50
    r = subprocess.run([sys.executable, "-m", "hft_infer.replay.capture", str(tmp_path / "missing.cap")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_decode_events_takes_the_events_of_an_event_batch_in_order(tmp_path):
    from hft_infer.replay.pacer import FeedColumns
    from hft_infer.transport.codec import BATCH_TOPIC

    ev = _session(levels=1)  # every quote of the feed's depth: the whole table goes in one batch
    cols = FeedColumns.of_events(ev)
    assert cols.batchable.all() and cols.kind  # quotes and trades
    frames = encode_frames(ev)
    msgs = frames[:2] + [(BATCH_TOPIC, encode(cols.batch(2, 12, 0)))]
    p = tmp_path / "b.cap"
    write_capture(p, range(len(msgs)), msgs)
    d = decode_events(read_capture(p))
    np.testing.assert_array_equal(d.events, ev)
    assert d.record_index.tolist() == [0, 1] + [2] * 10 and d.undecodable == 0
