"""`hft-infer shard-plan`: each universe instrument's events in a real capture file become
universe.shard_weights, and the plan they give is the one a shard's config serves (real CLI
subprocesses, real files)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from hft_infer.config import load_config
from hft_infer.replay.capture import write_capture
from hft_infer.replay.events import encode_frames
from hft_infer.replay.synthetic import SyntheticConfig, generate


def cli(*args):
    return subprocess.run([sys.executable, "-m", "hft_infer", "shard-plan", *args], capture_output=True, text=True,
                          timeout=120)


def test_a_capture_gives_the_weights_that_balance_every_shard_config(tmp_path):
    events = generate(3000, SyntheticConfig(instruments=8, seed=5, activity_dispersion=1.0))
    events["instrument"] = np.asarray([40, 41, 42, 43, 44, 45, 46, 99], dtype=np.uint32)[events["instrument"]]
    cap = tmp_path / "day.cap"
    write_capture(cap, (1_700_000_000_000_000_000 + 50_000 * np.arange(3000)).tolist(), encode_frames(events))
    ids = "universe.ids=[46, 45, 44, 43, 42, 41, 40]"  # 99 is not served: its events are not counted
    out = tmp_path / "weights.toml"
    r = cli(str(cap), "--shards", "3", "--set", ids, "--out", str(out))
    assert r.returncode == 0, r.stderr
    counts = [int(np.count_nonzero(events["instrument"] == i)) for i in (46, 45, 44, 43, 42, 41, 40)]
    outside = int(np.count_nonzero(events["instrument"] == 99))
    assert f"{sum(counts):,} events from {cap}" in r.stdout
    assert f"({outside:,} events of instruments outside" in r.stdout
    text = out.read_text()
    assert "[universe]\nshard_weights = [" + ", ".join(map(str, counts)) + "]\n" in text
    # the written line in each shard's config: its events per shard are the table's "by weights" column
    cfg_file = tmp_path / "shard.toml"
    cfg_file.write_text(text.replace("[universe]\n", f"[universe]\nids = {ids.split('=', 1)[1]}\n"))
    per_shard = []
    for k in range(3):
        owned = load_config(str(cfg_file), [f"universe.shard_index={k}", "universe.shard_count=3"]).universe.owned_ids()
        per_shard.append(int(np.isin(events["instrument"], owned).sum()))
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"])]
    assert [int(row[5].replace(",", "")) for row in rows] == per_shard
    assert [int(row[2].replace(",", "")) for row in rows] == [sum(counts[k::3]) for k in range(3)]
    busiest = max(per_shard) / (sum(counts) / 3)
    assert f"{busiest:.3f}x by weights" in r.stdout
    assert max(per_shard) <= max(sum(counts[k::3]) for k in range(3))


def test_synthetic_prints_the_line_and_bad_input_is_one_line():
    r = cli("synthetic", "--shards", "2", "--set", "universe.instruments=4", "--events", "1000")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("shard_weights = [")
    for args, says in ((["synthetic", "--shards", "5", "--set", "universe.instruments=4"], "--shards must be 1..4"),
                       (["synthetic", "--shards", "2", "--events", "0"], "--events must be >= 1"),
                       (["nowhere.cap", "--shards", "2"], "nowhere.cap")):
        r = cli(*args)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
