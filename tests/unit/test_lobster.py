"""LOBSTER parsing against the hand-written fixtures in tests/fixtures/lobster/.

AAPL (2 levels) has one row of every message type, dummy levels, halts and
an empty book; MSFT (1 level) interleaves with it in time; BAD has one
malformed line of each kind; NODATE has a name without a date.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hft_infer.replay import lobster, lobster_text
from hft_infer.replay.events import KIND_QUOTE, KIND_TRADE, encode_frames, event_dtype
from hft_infer.replay.lobster import (
    LobsterError,
    find_pairs,
    load_lobster,
    parse_name,
    time_ns_from_text,
)
from hft_infer.transport.codec import IngressDecoder, validate_quote, validate_trade

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lobster"
AAPL = FIX / "AAPL_2012-06-21_34200000_57600000_message_2.csv"
AAPL_BOOK = FIX / "AAPL_2012-06-21_34200000_57600000_orderbook_2.csv"
MSFT = FIX / "MSFT_2012-06-21_34200000_57600000_message_1.csv"
BAD = FIX / "BAD_2012-06-22_34200000_57600000_message_1.csv"
BAD_BOOK = FIX / "BAD_2012-06-22_34200000_57600000_orderbook_1.csv"
NODATE = FIX / "NODATE_message_x.csv"

MIDNIGHT_2012_06_21 = 1_340_236_800 * 10**9  # 2012-06-21T00:00:00Z
S = 10**9


def _ts(seconds_text: str) -> int:
    whole, _, frac = seconds_text.partition(".")
    return MIDNIGHT_2012_06_21 + int(whole) * S + int(frac.ljust(9, "0"))


def _book(*levels):
    """Expected book rows as (bid_px, bid_size, ask_px, ask_size) float32."""
    return np.array(levels, np.float32).reshape(-1, 4)


# -- one instrument, every message type ----------------------------------------


@pytest.fixture(scope="module")
def aapl():
    return load_lobster([(AAPL, AAPL_BOOK)])


def test_every_message_type_maps_to_the_documented_events(aapl):
    ev = aapl.events
    assert ev.dtype == event_dtype(2)
    kinds = "".join("Q" if k == KIND_QUOTE else "T" for k in ev["kind"])
    # rows: 1 Q, 1 Q, 2 Q, 4 T+Q, 5 T, 3 Q, 7 7 7 (none), 6 T, 3 Q, 3 Q, 3 Q
    assert kinds == "QQQTQTQTQQQ"
    assert ev["seq"].tolist() == list(range(11))
    assert (ev["instrument"] == 0).all() and (ev["priority"] == -1).all()
    c = aapl.counts
    assert (c["rows"], c["events"], c["quotes"], c["trades"], c["skipped_rows"]) == (13, 11, 8, 3, 0)
    assert [c[f"type_{t}"] for t in range(1, 8)] == [2, 1, 4, 1, 1, 1, 3]
    assert (c["halts"], c["quote_resumes"], c["trade_resumes"]) == (1, 1, 1)
    assert aapl.skipped == [] and aapl.levels == 2 and aapl.instruments == {0: "AAPL"}


def test_timestamps_are_exact_nanoseconds_from_the_file_date(aapl):
    assert aapl.events["ts_exchange_ns"].tolist() == [
        _ts("34200.004241176"), _ts("34200.025551909"), _ts("34200.2"),
        _ts("34200.201"), _ts("34200.201"), _ts("34200.201"), _ts("34200.5"),
        _ts("34202.5"), _ts("34203.123456789"), _ts("34204"), _ts("34205")]


def test_quotes_carry_the_book_after_the_message_in_our_level_layout(aapl):
    ev = aapl.events
    # row 1: bid 585.33 x 18, ask 585.36 x 200, ask 585.40 x 100, bid level 2 a dummy
    np.testing.assert_array_equal(ev["book"][0], _book((585.33, 18, 585.36, 200), (0, 0, 585.40, 100)))
    assert ev["n_levels"][0] == 2
    # row 3 (partial cancel): bid level 2 down from 30 to 20
    np.testing.assert_array_equal(ev["book"][2], _book((585.33, 18, 585.36, 200), (585.30, 20, 585.40, 100)))
    # row 11: bid side empty, two asks: depth is the deeper side's
    np.testing.assert_array_equal(ev["book"][8], _book((0, 0, 585.36, 200), (0, 0, 585.40, 100)))
    assert ev["n_levels"][8] == 2
    # row 12: one real level left
    assert ev["n_levels"][9] == 1
    np.testing.assert_array_equal(ev["book"][9], _book((0, 0, 585.40, 100), (0, 0, 0, 0)))
    # row 13: an empty book is one all-zero level (the validator needs n_levels >= 1)
    assert ev["n_levels"][10] == 1 and not ev["book"][10].any()


def test_executions_are_trades_with_the_aggressor_side(aapl):
    ev = aapl.events
    t = ev[ev["kind"] == KIND_TRADE]
    # type 4: resting buy (direction 1) hit by a seller -> side -1, then the book after it
    assert (t["price"][0], t["size"][0], t["side"][0]) == (585.33, 8.0, -1)
    np.testing.assert_array_equal(ev["book"][4], _book((585.33, 10, 585.36, 200), (585.30, 20, 585.40, 100)))
    # type 5: hidden resting sell -> buyer-initiated, no quote (visible book unchanged)
    assert (t["price"][1], t["size"][1], t["side"][1]) == (585.35, 50.0, 1)
    assert ev["kind"][6] == KIND_QUOTE and ev["ts_exchange_ns"][6] == _ts("34200.5")
    # type 6: auction cross, side = -direction
    assert (t["price"][2], t["size"][2], t["side"][2]) == (585.34, 500.0, 1)
    # trades carry no book
    assert not t["book"].any() and (t["n_levels"] == 0).all()


def test_quote_after_execution_can_be_left_out():
    r = load_lobster([(AAPL, AAPL_BOOK)], quote_after_execution=False)
    assert "".join("Q" if k == KIND_QUOTE else "T" for k in r.events["kind"]) == "QQQTTQTQQQ"


def test_every_event_passes_the_service_validator(aapl):
    dec = IngressDecoder().decode
    for _, payload in encode_frames(aapl.events):
        msg = dec(payload)
        if msg.__class__.__name__ == "Quote":
            assert validate_quote(msg, 64) == 0
        else:
            assert validate_trade(msg) == 0


def test_levels_cut_and_pad():
    one = load_lobster([(AAPL, AAPL_BOOK)], levels=1).events
    assert one.dtype == event_dtype(1)
    np.testing.assert_array_equal(one["book"][0], _book((585.33, 18, 585.36, 200)))
    assert one["n_levels"].max() == 1
    four = load_lobster([(AAPL, AAPL_BOOK)], levels=4).events
    assert four.dtype == event_dtype(4) and not four["book"][:, 2:].any()
    assert four["n_levels"].max() == 2
    with pytest.raises(LobsterError, match="levels must be >= 1"):
        load_lobster([(AAPL, AAPL_BOOK)], levels=0)


# -- several instruments ---------------------------------------------------------


def test_several_files_merge_in_time_order_with_per_instrument_seq():
    r = load_lobster(find_pairs([AAPL, MSFT]))
    ev = r.events
    assert r.levels == 2 and r.instruments == {0: "AAPL", 1: "MSFT"}
    assert (np.diff(ev["ts_exchange_ns"]) >= 0).all()
    for inst, n in ((0, 11), (1, 4)):
        assert ev["seq"][ev["instrument"] == inst].tolist() == list(range(n))
    # MSFT's 34200.1 quote lands between AAPL's 34200.025551909 and 34200.2
    assert ev["instrument"][:4].tolist() == [0, 0, 1, 0]
    # equal times: list order (AAPL's three events at 34200.201 before MSFT's)
    same = ev[ev["ts_exchange_ns"] == _ts("34200.201")]
    assert same["instrument"].tolist() == [0, 0, 0, 1]
    # the 1-level file is padded to 2 levels
    msft = ev[ev["instrument"] == 1]
    np.testing.assert_array_equal(msft["book"][0], _book((0, 0, 280.15, 5), (0, 0, 0, 0)))
    assert r.counts["events"] == 15


def test_instrument_ids_by_position_or_ticker():
    r = load_lobster(find_pairs([AAPL, MSFT]), instrument_ids=[7, 3])
    assert set(r.events["instrument"].tolist()) == {7, 3} and r.instruments == {7: "AAPL", 3: "MSFT"}
    r = load_lobster(find_pairs([AAPL, MSFT]), instrument_ids={"MSFT": 9, "AAPL": 8})
    assert r.instruments == {8: "AAPL", 9: "MSFT"}
    with pytest.raises(LobsterError, match="no instrument id for ticker 'MSFT'"):
        load_lobster(find_pairs([AAPL, MSFT]), instrument_ids={"AAPL": 8})
    with pytest.raises(LobsterError, match="1 instrument ids for 2"):
        load_lobster(find_pairs([AAPL, MSFT]), instrument_ids=[1])
    with pytest.raises(LobsterError, match="outside"):
        load_lobster(find_pairs([AAPL]), instrument_ids=[2**32 - 1])


def test_find_pairs_from_messages_orderbooks_and_folders():
    assert find_pairs([AAPL]) == [(AAPL, AAPL_BOOK)]
    assert find_pairs([AAPL_BOOK, AAPL]) == [(AAPL, AAPL_BOOK)]  # either half, used once
    pairs = find_pairs([FIX])
    assert [p[0].name.split("_")[0] for p in pairs] == ["AAPL", "BAD", "MSFT", "NODATE"]
    assert all(b.is_file() for _, b in pairs)


def test_find_pairs_names_what_is_missing(tmp_path):
    (tmp_path / "X_2012-06-21_0_1_message_1.csv").write_text("1,1,1,1,1,1\n")
    with pytest.raises(LobsterError, match="matching orderbook file X_2012-06-21_0_1_orderbook_1.csv not found"):
        find_pairs([tmp_path / "X_2012-06-21_0_1_message_1.csv"])
    with pytest.raises(LobsterError, match="no such message file"):
        find_pairs([tmp_path / "Y_message_1.csv"])
    with pytest.raises(LobsterError, match="not a LOBSTER message file"):
        find_pairs([AAPL.with_name("notes.csv")])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LobsterError, match="no \\*_message_\\*.csv files"):
        find_pairs([empty])


def test_file_name_without_a_date_starts_at_epoch_zero():
    assert parse_name(AAPL) == lobster.LobsterName("AAPL", "2012-06-21", 2)
    assert parse_name(NODATE) == lobster.LobsterName("NODATE", None, None)
    r = load_lobster(find_pairs([NODATE]))
    assert r.events["ts_exchange_ns"].tolist() == [500_000_000, 1_250_000_000]
    assert r.levels == 1  # from the column count


# -- malformed lines ----------------------------------------------------------------

BAD_EXPECTED = [
    (BAD, 2, "expected 6 fields, got 5"),
    (BAD, 3, "field 4 is not an integer: 'abc'"),
    (BAD, 4, "time '36000.x' is not a decimal number of seconds"),
    (BAD, 5, "time '36000.1234567891' has more than 9 decimal places"),
    (BAD, 6, "unknown message type 8 (expected 1..7)"),
    (BAD, 7, "direction must be 1 or -1, got 0"),
    (BAD, 8, "negative size -5"),
    (BAD, 9, "price must be positive, got 0"),
    (BAD, 10, "halt message price must be -1, 0 or 1, got 5"),
    (BAD, 11, "empty line"),
    (BAD_BOOK, 12, "level 1: ask price -5 is neither positive nor the dummy 9999999999"),
    (BAD_BOOK, 13, "field 3 is not an integer: '1000000.5'"),
    (BAD, 14, "time goes backwards (36001000000000 ns < previous 36001300000000 ns after midnight)"),
    (BAD, 16, "no orderbook row for this message (the orderbook file is shorter)"),
]


def test_malformed_lines_are_reported_with_file_and_line_and_skipped():
    r = load_lobster(find_pairs([BAD]))
    assert r.skipped == [f"{p}:{n}: {why}" for p, n, why in BAD_EXPECTED]
    assert r.counts["rows"] == 16 and r.counts["skipped_rows"] == 14 and r.counts["malformed_lines"] == 14
    # the two good lines (1 and 15) survive, numbered 0 and 1
    assert r.events["ts_exchange_ns"].tolist() == [
        MIDNIGHT_2012_06_21 + 86400 * S + 36000 * S + 100_000_000,
        MIDNIGHT_2012_06_21 + 86400 * S + 36001 * S + 500_000_000]
    assert r.events["seq"].tolist() == [0, 1]


def test_strict_raises_at_the_first_malformed_line():
    with pytest.raises(LobsterError) as e:
        load_lobster(find_pairs([BAD]), strict=True)
    assert str(e.value) == f"{BAD}:2: expected 6 fields, got 5"


def test_max_reported_caps_the_list_not_the_count():
    r = load_lobster(find_pairs([BAD]), max_reported=3)
    assert len(r.skipped) == 3 and r.counts["malformed_lines"] == 14


def test_small_chunks_give_the_same_result(monkeypatch):
    """Chunk and sub-chunk boundaries (line numbers, the previous-time check) are invisible."""
    want = load_lobster(find_pairs([BAD, AAPL, MSFT]))
    monkeypatch.setattr(lobster, "CHUNK_LINES", 3)
    monkeypatch.setattr(lobster_text, "SUBCHUNK_LINES", 2)
    got = load_lobster(find_pairs([BAD, AAPL, MSFT]))
    assert got.skipped == want.skipped and got.counts == want.counts
    np.testing.assert_array_equal(got.events, want.events)


def test_crlf_line_endings_and_a_missing_final_newline(tmp_path):
    for src in (AAPL, AAPL_BOOK):
        text = src.read_text().replace("\n", "\r\n").rstrip("\r\n")
        (tmp_path / src.name).write_bytes(text.encode())
    got = load_lobster(find_pairs([tmp_path / AAPL.name]))
    want = load_lobster([(AAPL, AAPL_BOOK)])
    assert got.skipped == []
    np.testing.assert_array_equal(got.events, want.events)


def test_extra_orderbook_rows_are_reported(tmp_path):
    m = tmp_path / "Z_2012-06-21_0_1_message_1.csv"
    b = tmp_path / "Z_2012-06-21_0_1_orderbook_1.csv"
    m.write_text("1.5,1,1,10,1000000,1\n")
    b.write_text("1000100,5,1000000,10\n1000100,5,1000000,10\n")
    r = load_lobster([(m, b)])
    assert r.skipped == [f"{b}:2: orderbook row without a message row (the message file is shorter)"]
    assert r.counts["events"] == 1


def test_orderbook_with_unknown_shape_is_a_clear_error(tmp_path):
    m = tmp_path / "Q_message_x.csv"
    b = tmp_path / "Q_orderbook_x.csv"
    m.write_text("1.5,1,1,10,1000000,1\n")
    b.write_text("1000100,5,1000000\n")
    with pytest.raises(LobsterError, match="rows have 3 fields, not a multiple of 4"):
        load_lobster([(m, b)])


def test_an_overlong_time_field_is_rejected_not_truncated(tmp_path):
    m = tmp_path / "L_2012-06-21_0_1_message_1.csv"
    b = tmp_path / "L_2012-06-21_0_1_orderbook_1.csv"
    m.write_text("1." + "0" * 60 + ",1,1,10,1000000,1\n2.5,1,1,10,1000000,1\n")
    b.write_text("1000100,5,1000000,10\n" * 2)
    r = load_lobster([(m, b)])
    assert r.skipped == [f"{m}:1: time field is longer than 39 characters"]
    assert r.counts["events"] == 1


# -- exact time parsing --------------------------------------------------------------


@pytest.mark.parametrize("text, ns", [
    (b"34200.004241176", 34200_004241176), (b"0", 0), (b"0.5", 500_000_000), (b"86399.999999999", 86399_999999999),
    (b"34200.", 34200 * S), (b" 7.25 ", 7_250_000_000), (b"999999999.000000001", 999999999 * S + 1),
])
def test_time_text_to_ns(text, ns):
    assert time_ns_from_text(text) == ns


@pytest.mark.parametrize("text", [b"", b".5", b"-1.0", b"1e3", b"1.2.3", b"12:00", b"1.0000000001", b"1000000000.0"])
def test_bad_time_text_has_a_reason(text):
    assert isinstance(time_ns_from_text(text), str)


_DIGITS = st.text(alphabet="0123456789", max_size=11)
_DECIMALS = st.builds(lambda a, dot, b: (a + ("." if dot else "") + b).encode(), _DIGITS, st.booleans(), _DIGITS)
_NEAR_MISSES = st.text(alphabet="0123456789. -+e\t", max_size=12).map(str.encode)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(_DECIMALS, _NEAR_MISSES), min_size=1, max_size=20))
def test_vectorised_time_parser_agrees_with_the_reference(texts):
    raw = np.array(texts, dtype="S40")
    ns, ok = lobster_text.times_ns(raw)
    for t, v, good in zip(raw.tolist(), ns.tolist(), ok.tolist()):
        ref = time_ns_from_text(t)
        if good:  # whatever the fast path accepts, the reference accepts with the same value
            assert ref == v
        else:  # and it only leaves to the slow path what is malformed or needs stripping
            assert isinstance(ref, str) or t != t.strip()
