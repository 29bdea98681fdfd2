"""tools/fuzz_service.py's expectations of what the service counts, against the service's decoder."""

from __future__ import annotations

from fuzz_service import expectations

from hft_infer.transport.codec import SERVICE_TOPIC, IngressDecoder, topic_for
from hft_infer.transport.schema import Reset


def test_a_reset_with_an_undecodable_string_in_a_trailing_field_is_not_an_event():
    """Seed 2 of the fuzzer mutated a Quote into a Reset with extra trailing fields, one a string of
    invalid UTF-8: msgspec skips fields past a struct's own without reading them, so the service
    applied a Reset (not an event); the fuzzer's msgpack peek decoded strings as UTF-8, failed, and
    expected one event more than the service counted. (Seed 2 sent it on instrument 34's topic,
    where a Reset of instrument 4 is now rejected as TOPIC_MISMATCH, an event: codec.reset_topic_ok.)"""
    payload = b"\x95\x04\x04\x04\x00\xa2\xff\xfe"  # [4, 4, 4, 0, <2 bytes of invalid UTF-8 as a str>]
    assert IngressDecoder().decode(payload) == Reset(4, 4)
    for topic, not_events in ((topic_for(4), 1), (SERVICE_TOPIC, 1), (topic_for(34), 0)):
        exp = expectations([[topic, payload]])
        assert (exp["not_events"], exp["batch_extra"], exp["mergeable"]) == (not_events, 0, 0), topic


def test_a_quote_whose_map_has_an_array_key_names_its_instrument_and_seq_to_both_sides():
    """Seed 4502 mutated a Quote's fields into a map keyed by an array ({[32]: 32, 32: 0}): the
    service's untyped msgspec peek reads the array key as a tuple and answers the rejected frame
    with its instrument and seq (2, 18); the fuzzer's msgpack peek, arrays as lists, failed on the
    unhashable key and called that answer a phantom. Both read it now."""
    from hft_infer.ingest_cold import _peek

    payload = bytes.fromhex("98010212248291202020000ac4040000c842ff")  # [1, 2, 18, 36, {(32,): 32, 32: 0}, 10, ...]
    assert _peek(payload)[:3] == [1, 2, 18]
    exp = expectations([[topic_for(29), payload]])
    assert (2, 18) in exp["readable"]
    assert exp["readable_invalid"] == 1  # not a Quote the schema reads: rejected, and it must be answered
