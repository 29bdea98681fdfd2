"""The loop's stall counters: phases summed over the recorded iterations, in whole microseconds."""

from hft_infer.loop_stalls import PHASES, LoopStalls


def test_phases_are_summed_over_the_stalls_recorded():
    s = LoopStalls(threshold_ns=250_000)
    assert s.counters() == {"stalls": 0, **{f"stall_{p}_us": 0 for p in PHASES}}
    s.record(10_000, 2_000, 300_000, 1_500, 999)
    s.record(400_000, 0, 0, 500, 1)
    assert s.counters() == {"stalls": 2, "stall_ingest_us": 410, "stall_complete_us": 2, "stall_submit_us": 300,
                            "stall_other_us": 2, "stall_yield_us": 1}
