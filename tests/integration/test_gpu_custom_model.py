"""A user's torch module (model.module) served through the graph engine on a GPU: one CUDA
graph per batch bucket, its scores against the CPU engine's, and a real `hft-infer serve` with
`runner.engine = "graph"` checked by `replay --verify` (skipped without CUDA).

    python -m pytest -q tests/integration/test_gpu_custom_model.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
USER = ROOT / "tests" / "user_models" / "cnn.py"
N_SLOTS = 8
COMMON = ["runner.buckets=[1, 2, 4, 8]", "scheduler.max_batch=8", "universe.instruments=8"]


def _runtime(factory: str, engine: str, device: str, *, self_check: bool = True):
    from hft_infer.config import load_config
    from hft_infer.runner.select import build_runtime

    cfg = load_config(None, [f'model.module="{USER}:{factory}"', f'runner.engine="{engine}"',
                             f'runner.device="{device}"', f"runner.self_check={'true' if self_check else 'false'}",
                             *COMMON])
    return build_runtime(cfg, N_SLOTS)


@pytest.mark.parametrize("factory", ["make_model", "make_gru"])
def test_graph_engine_serves_the_user_module_as_the_cpu_engine_does(factory):
    from hft_infer.runner.self_check import check_stream, drive

    gpu = _runtime(factory, "graph", "cuda", self_check=False)
    cpu = _runtime(factory, "eager", "cpu")
    try:
        assert gpu.engine.name == "graph" and gpu.engine.ready
        assert sorted(b for _, b in gpu.engine.graphs) == sorted([1, 2, 4, 8] * gpu.engine.max_inflight)
        assert gpu.model_version == cpu.model_version and gpu.conflate
        data, slots, batches = check_stream(gpu.store.width, N_SLOTS, 8, rows=400, seed=11)
        want, want_a = drive(cpu.engine, cpu.store, data, slots, batches)
        got, got_a = drive(gpu.engine, gpu.store, data, slots, batches)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)  # fp32, another summation order
        near = np.abs(np.abs(want) - 0.2) < 1e-4  # actions agree away from the threshold
        assert (got_a[~near] == want_a[~near]).all()
        # after a reset the same stream gives the same scores (no state leaks across steps)
        gpu.engine.reset()
        again, _ = drive(gpu.engine, gpu.store, data, slots, batches)
        np.testing.assert_allclose(again, got, atol=1e-6, rtol=0)
    finally:
        gpu.engine.close()
        cpu.engine.close()


def test_auto_picks_the_graph_engine_and_says_why():
    rt = _runtime("make_model", "auto", "cuda")  # self-checked against the CPU engine at build
    try:
        if rt.engine.name == "graph":  # or refused as too slow against the CPU (runner/self_check.py)
            assert "custom module" in rt.engine.reason and "ms on the CPU engine" in rt.engine.reason
        else:
            assert rt.engine.name == "eager" and "graph is slower than the CPU engine here" in rt.engine.reason
    finally:
        rt.engine.close()


def test_serve_on_the_graph_engine_and_replay_verify(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from service_harness import ServiceUnderTest

    overrides = [f'model.module="{USER}:make_model"', 'runner.engine="graph"', "scheduler.max_age_us=10000000"]
    with ServiceUnderTest(overrides) as svc:
        svc.start(feed=False, timeout_s=300)
        env = dict(os.environ, HFT_INFER_RUNTIME_DIR=svc.runtime)
        r = subprocess.run([sys.executable, "-m", "hft_infer", "replay", "synthetic", "--events", "5000",
                            "--instruments", "16", "--rate", "20000", "--verify", "--set", "service.name=t",
                            *sum((["--set", o] for o in overrides), []), "--run-dir", str(tmp_path / "run"),
                            "--quiet"], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr + r.stdout
        svc.stop()
        service = svc.summary()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert service["engine"] == "graph" and summary["verify"]["mismatches"] == 0
    assert summary["verify"]["compared"] == summary["accounting"]["decided"] > 0 and summary["accounting"]["lost"] == 0
