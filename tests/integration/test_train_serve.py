"""`hft-infer train` on the LOBSTER fixture and on a capture file, then a real `hft-infer serve`
with the checkpoint it wrote and `hft-infer replay --verify` of the same data against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from service_harness import ServiceUnderTest

from hft_infer.models.checkpoint import read_header
from hft_infer.replay.capture import write_capture
from hft_infer.replay.events import encode_frames
from hft_infer.replay.synthetic import SyntheticConfig, generate

ROOT = Path(__file__).resolve().parents[2]
LOBSTER = ROOT / "tests" / "fixtures" / "lobster"


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "hft_infer", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _serve_and_verify(checkpoint: Path, sources: list[str], run_dir: Path) -> tuple[dict, dict]:
    # a late pacer on a loaded 2-core machine must not shed the events this test verifies
    overrides = [f'model.checkpoint="{checkpoint}"', "scheduler.max_age_us=10000000"]
    with ServiceUnderTest(overrides) as svc:
        svc.start(feed=False)
        env = dict(os.environ, HFT_INFER_RUNTIME_DIR=svc.runtime)
        r = cli("replay", *sources, "--rate", "20000", "--verify", "--set", "service.name=t",
                *sum((["--set", o] for o in overrides), []), "--run-dir", str(run_dir), "--quiet", env=env)
        assert r.returncode == 0, r.stderr + r.stdout
        assert " 0 mismatches" in r.stderr, r.stderr
        svc.stop()
        service = svc.summary()
    return json.loads((run_dir / "summary.json").read_text()), service


def test_train_on_the_lobster_fixture_then_serve_and_verify(tmp_path):
    files = [str(next(LOBSTER.glob("AAPL*message*"))), str(next(LOBSTER.glob("AAPL*orderbook*"))),
             str(next(LOBSTER.glob("MSFT*message*")))]
    out = tmp_path / "lobster.safetensors"
    r = cli("train", *files, "--horizon", "2", "--heldout-fraction", "0.25", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "| model |" in r.stdout and f"wrote {out}" in r.stdout
    header = read_header(out)
    assert header.extra["data"]["source"] == "lobster" and header.extra["horizon_events"] == 2
    assert header.extra["data"]["train_events"] + header.extra["data"]["heldout_events"] == \
        header.extra["data"]["events"] > 10
    summary, service = _serve_and_verify(out, [files[0], files[2]], tmp_path / "run")
    assert summary["verify"]["compared"] > 0 and summary["verify"]["model_version"] == service["model_version"]
    assert summary["accounting"]["lost"] == 0


def test_train_on_a_capture_then_serve_and_verify(tmp_path):
    events = generate(4000, SyntheticConfig(instruments=8, seed=21))
    frames = encode_frames(events)  # ts_send_ns 0: a recorded feed's own send times would be stale at replay
    cap = tmp_path / "session.cap"
    write_capture(cap, (1_700_000_000_000_000_000 + 50_000 * np.arange(4000)).tolist(), frames)
    out = tmp_path / "capture.safetensors"
    r = cli("train", str(cap), "--epochs", "2", "--batch", "256", "--out", str(out))
    assert r.returncode == 0, r.stderr
    header = read_header(out)
    metrics = header.extra["heldout_metrics"]
    assert header.extra["data"]["source"] == "capture" and header.extra["data"]["heldout_events"] == 800
    assert metrics["labels"]["n"] > 600 and 0.0 < metrics["model"]["auc"] <= 1.0
    summary, service = _serve_and_verify(out, [str(cap)], tmp_path / "run")
    assert summary["verify"]["compared"] == summary["accounting"]["decided"] > 0 and summary["accounting"]["lost"] == 0
    assert service["model_version"] == summary["verify"]["model_version"] != ""
