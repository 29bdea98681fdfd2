"""tools/bench_gpu_ceiling.py's orchestration on this host: a real worker process built as serve
builds its engine (the CPU engine here: the GPU run is the benchmark itself, on the device
machine), started by the parent's start time, its rows counted into the table and the JSON."""

from __future__ import annotations

import json

from tool_run import run_compile_tool


def test_the_ceiling_tool_runs_its_workers_and_sums_their_rows(tmp_path):
    out = tmp_path / "ceiling.json"
    r = run_compile_tool("bench_gpu_ceiling.py", "--procs", "1", "--cores", "0", "--batches", "2,4",
                         "--precisions", "fp32", "--seconds", "0.3", "--engine", "eager", "--device", "cpu",
                         "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(out.read_text())["result"]
    # per batch: solo, then all (one) at once
    assert [(res["batch"], res["procs"]) for res in results] == [(2, 1), (2, 1), (4, 1), (4, 1)]
    for res in results:
        (proc,) = res["per_proc"]
        assert proc["steps"] > 0 and proc["rows"] == res["batch"] * proc["steps"] and proc["p50_us"] > 0
        assert abs(res["rows_per_s"] - proc["rows"] / 0.3) < 1e-6 * res["rows_per_s"]
    assert "rows/s vs fp32" in r.stdout and "1 at once" in r.stdout


def test_the_ceiling_tool_refuses_a_batch_past_the_largest_bucket_and_too_few_cores():
    r = run_compile_tool("bench_gpu_ceiling.py", "--batches", "8,100")
    assert r.returncode == 2 and "--batches: each 1 to 64" in r.stderr
    r = run_compile_tool("bench_gpu_ceiling.py", "--procs", "3", "--cores", "0-1")
    assert r.returncode == 2 and "2 cores for 3 processes" in r.stderr
