"""bench --shards: bad input is one line and exit 2 before any process starts; the collector
split and the exit status of a sharded run (real subprocesses for the CLI cases)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hft_infer.app.shards import collector_count
from hft_infer.app.shards_report import shards_exit_status
from hft_infer.config import load_config
from hft_infer.errors import UserError


def run(*args, tmp_path):
    return subprocess.run([sys.executable, "-m", "hft_infer", "bench", *args, "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, says", [
    (["--shards", "0"], "--shards must be >= 1 (got 0)"),
    (["--shards", "65"], "--shards 65 exceeds the universe's 64 instruments"),
    (["--shards", "4", "--instruments", "3"], "a shard would get no events (need --instruments >= 4)"),
    (["--shards", "2", "--set", "universe.shard_count=2"], "the config already names shard 0/2"),
    (["--shards", "2", "--set", "ingest.topic_frame=false"], "needs ingest.socket_type = \"sub\""),
    (["--shards", "2", "--set", 'egress.endpoint="ipc:///tmp/one-decisions.sock"'],
     "egress.endpoint = 'ipc:///tmp/one-decisions.sock' would be the same for every shard"),
    (["--shards", "2", "--set", 'metrics.control_endpoint="ipc:///tmp/one-control.sock"'],
     "metrics.control_endpoint"),
    (["--shards", "2", "--shard-collectors", "0"], "--shard-collectors must be >= 1 and needs --shards"),
    (["--shard-collectors", "2"], "--shard-collectors must be >= 1 and needs --shards"),
    (["--shards", "2", "--collectors", "2"], "with --shards, --shard-collectors K"),
    (["--feed-batch", "0"], "--feed-batch must be 1..65536"),
    (["--balance-shards"], "--balance-shards goes with --shards N"),
    (["--shards", "2", "--balance-shards", "--set", "universe.instruments=2", "--set", "universe.shard_weights=[1, 2]"],
     "the config already sets them"),
])
def test_bad_shard_options_are_one_line_and_exit_2_before_any_run(args, says, tmp_path):
    r = run(*args, tmp_path=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr
    assert "generating" not in r.stderr


def test_collectors_divide_the_shards_and_fit_beside_them():
    assert collector_count(8, None, pool=2, service_cores=0) == 1  # small machine: one, blocking
    assert collector_count(4, None, pool=16, service_cores=4) == 4  # 16 - 4 - pacer - 2 helpers >= 4
    assert collector_count(8, None, pool=16, service_cores=8) == 4  # 5 cores left: the divisor 4 of 8
    assert collector_count(6, None, pool=12, service_cores=6) == 3  # 3 left: 3, not 4 (6 % 4 != 0)
    # two cores stay for the I/O threads: 12 shards on 16 cores get one collector (16 - 12 - pacer - 2),
    # not two (which left the I/O threads one core: saturated at 1M events/s, BENCHMARKS.md wave 27)
    assert collector_count(12, None, pool=16, service_cores=12) == 1
    assert collector_count(10, None, pool=16, service_cores=10) == 2
    assert collector_count(2, 5, pool=2, service_cores=0) == 2  # asked for: at most one per shard
    with pytest.raises(UserError):
        collector_count(2, 0, pool=16, service_cores=2)


def _out(lost=0, unmatched=0, code=0):
    shard = {"shard": "0/1", "service_exit_code": code, "run_dir": "r"}
    return {"per_shard": [shard], "aggregate": {"accounting": {"lost": lost, "sent": 10},
                                                "unmatched_decisions": unmatched}}


@pytest.mark.parametrize("out, says", [
    (_out(lost=3), "3 of 10 events lost"),
    (_out(unmatched=2), "2 answers name no event of their shard"),
    (_out(code=1), "shard 0/1 exited with code 1"),
])
def test_a_lost_event_a_wrong_shard_or_a_failed_shard_exits_1(out, says, capsys):
    assert shards_exit_status(out) == 1
    assert says in capsys.readouterr().err
    assert shards_exit_status(_out()) == 0


def test_the_universe_splits_by_position_into_disjoint_covering_shards():
    ids = [7, 3, 11, 5, 9]
    owned = [load_config(None, [f"universe.ids={ids}", f"universe.shard_index={i}",
                                "universe.shard_count=3"]).universe.owned_ids() for i in range(3)]
    assert owned == [[7, 5], [3, 9], [11]]


def test_the_harness_takes_cores_beside_all_the_shards():
    from hft_infer.app.launcher import plan_harness

    cfg = load_config(None, [])
    shards = list(range(8, 16))
    plan = plan_harness(cfg, "auto", 4, pool=list(range(16)), service_cores=shards)
    taken = [plan.pacer_core, *plan.collector_cores]
    assert len(set(taken)) == 5 and not set(taken) & set(shards)
    assert plan.service_cores == shards and not set(plan.helper_cores) & (set(taken) | set(shards))
    assert plan.pacer_spin and plan.collector_spin
    small = plan_harness(cfg, "auto", 1, pool=[0, 1], service_cores=[0, 1])
    assert small.pacer_core is None and not small.pacer_spin and not small.collector_spin
