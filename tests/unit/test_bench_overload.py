"""tools/bench_overload.py's arithmetic: capacity and the overload verdicts from bench summaries
(the runs themselves are real `hft-infer bench` processes; this checks what is made of them)."""

from __future__ import annotations

from bench_overload import capacity, point, run_order


def _run(rate, decided, shed, conflated, lost=0, rejected=0):
    sent = decided + shed + conflated + rejected + lost
    return {"rate_offered": rate, "rate_achieved": rate * 0.99, "warmup_s": 1.0,
            "accounting": {"sent": sent, "decided": decided, "shed": shed, "conflated": conflated,
                           "rejected": rejected, "lost": lost},
            "tick_to_decision": {"p50_us": 10.0, "p99_us": 20.0}, "stages": {"service": {"p99_us": 5.0}}}


def test_capacity_is_the_highest_rate_that_kept_up():
    sweep = [point(_run(1000, 3900, 10, 90), 3.0), point(_run(2000, 7000, 70, 930), 3.0),  # 0.875 % shed
             point(_run(4000, 8000, 4000, 4000), 3.0), point(_run(8000, 100, 0, 0, lost=5), 3.0)]
    cap = capacity(sweep)
    assert cap["offered"] == 2000 and cap["decided_per_s"] == 7000 / 4.0  # warm-up second included
    assert sweep[3]["accounted"] and sweep[0]["shed_share"] == 10 / 4000


def test_no_capacity_when_nothing_kept_up():
    assert capacity([point(_run(1000, 10, 500, 0), 3.0)]) is None


def test_an_unaccounted_event_is_seen():
    p = point(_run(1000, 10, 0, 0), 3.0)
    p_bad = point({**_run(1000, 10, 0, 0), "accounting": {"sent": 12, "decided": 10, "shed": 0, "conflated": 0,
                                                          "rejected": 0, "lost": 0}}, 3.0)
    assert p["accounted"] and not p_bad["accounted"]


def test_a_point_carries_the_floor_of_its_own_run():
    run = {**_run(1000, 10, 0, 0), "floor": {"tick_to_decision": {"p50_us": 3.0, "p99_us": 7.5}}}
    assert point(run, 3.0)["floor_p99_us"] == 7.5
    assert point(_run(1000, 10, 0, 0), 3.0)["floor_p99_us"] is None  # run without --with-floor


def test_the_order_alternates_per_point_and_the_flag_swaps_every_point():
    v = [("this", "py"), ("baseline", "base/py")]
    names = [[x for x, _ in run_order(v, k)] for k in range(4)]
    swapped = [[x for x, _ in run_order(v, k, baseline_first=True)] for k in range(4)]
    assert names == [["this", "baseline"], ["baseline", "this"]] * 2
    assert swapped == [n[::-1] for n in names]
    assert run_order(v[:1], 1) == v[:1]  # no baseline: one variant, whatever the point
