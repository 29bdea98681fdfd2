"""A user's torch module (model.module) served end to end by a real `hft-infer serve` on the CPU
and checked by `hft-infer replay --verify`; bad modules stop `serve` at start with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from service_harness import ServiceUnderTest

ROOT = Path(__file__).resolve().parents[2]
USER = ROOT / "tests" / "user_models" / "cnn.py"
# a late pacer on a loaded 2-core machine must not shed the events these tests verify
PATIENT = ["scheduler.max_age_us=10000000"]
CNN = [f'model.module="{USER}:make_model"', "model.module_args={channels=12}", *PATIENT]


def cli(*args, env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "hft_infer", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _sets(overrides):
    return sum((["--set", o] for o in overrides), [])


def replay_verify(svc: ServiceUnderTest, overrides: list[str], run_dir: Path, *sources: str) -> dict:
    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=svc.runtime)
    extra = ["--events", "3000", "--instruments", "8", "--rate", "20000"] if sources == ("synthetic",) else \
        ["--rate", "20000"]
    r = cli("replay", *sources, *extra, "--verify", "--set", "service.name=t", *_sets(overrides),
            "--run-dir", str(run_dir), "--quiet", env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    assert " 0 mismatches" in r.stderr, r.stderr
    return json.loads((run_dir / "summary.json").read_text())


def test_a_user_cnn_served_on_the_cpu_and_verified(tmp_path):
    with ServiceUnderTest(CNN) as svc:
        svc.start(feed=False)
        summary = replay_verify(svc, CNN, tmp_path / "run", "synthetic")
        final = svc.stop()
        service = svc.summary()
    # every decided event (how many: timing; the rest conflated) matches the offline reference
    assert summary["verify"]["compared"] == summary["accounting"]["decided"] > 0
    assert summary["verify"]["mismatches"] == 0
    assert summary["accounting"]["lost"] == 0 and final.received == 3000
    assert service["model_version"] == summary["verify"]["model_version"]
    assert service["model_version"].startswith("make_model@")
    assert service["engine"] == "eager" and "custom module" in service["engine_reason"]
    assert service["identity_holds"]
    assert service["stages"]["step"]["count"] > 0


def test_a_module_with_the_wrong_output_shape_stops_serve_with_one_line(tmp_path):
    env = dict(os.environ, HFT_INFER_RUNTIME_DIR=str(tmp_path))
    r = cli("serve", "--set", f'model.module="{USER}:make_wrong_shape"', "--set", "service.name=bad",
            "--no-control", "--run-dir", str(tmp_path / "run"), env=env, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "returned shape [1, 2], expected [1, 3]" in lines[0] and "make_wrong_shape" in lines[0]
    assert not (tmp_path / "run").exists()
    r = cli("check-config", "--set", f'model.module="{USER}:nowhere"', env=env, timeout=120)
    assert r.returncode == 2 and "has no attribute 'nowhere'" in r.stderr and "Traceback" not in r.stderr
