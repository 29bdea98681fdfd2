"""tools/with_mps.sh: a private MPS daemon around one command. The daemon's controller is the
NVIDIA driver's (absent on CI machines), so these tests put a recording stand-in for
`nvidia-cuda-mps-control` and `nvidia-smi` first on PATH: what is tested is the script's own
lifecycle (start, the environment the command gets, the exit status passed on, the daemon told to
quit and its directory removed, refusals with a reason). The real daemon runs on the H200 host
(tools/gpu_session.sh, BENCHMARKS.md)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "with_mps.sh"

CONTROL = """#!/usr/bin/env bash
if [ "$1" = -d ]; then
  echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "$FAKE_MPS_LOG"
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit "${FAKE_MPS_START_RC:-0}"
fi
read -r line
echo "$line" >> "$FAKE_MPS_LOG"
[ "$line" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
exit 0
"""


def fake_bin(tmp_path: Path, compute_mode: str = "Default", with_control: bool = True) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/usr/bin/env bash\necho {compute_mode}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    if with_control:
        (bin_dir / "nvidia-cuda-mps-control").write_text(CONTROL)
        (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", FAKE_MPS_LOG=str(tmp_path / "calls"),
               TMPDIR=str(tmp_path))
    env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
    return env


def run(env: dict, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *cmd], env=env, capture_output=True, text=True, timeout=60)


def test_the_command_runs_under_a_private_daemon_that_quits_after_it(tmp_path):
    env = fake_bin(tmp_path)
    seen = tmp_path / "seen"
    r = run(env, "bash", "-c", f'echo "$CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" > {seen}; exit 7')
    assert r.returncode == 7, r.stderr  # the command's status, passed on
    pipe, log = seen.read_text().split()
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == f"start {pipe}"  # the daemon the command was given
    assert "get_default_active_thread_percentage" in calls  # it waited for the daemon to answer
    assert calls[-1] == "quit"
    assert pipe.startswith(str(tmp_path)) and log.startswith(str(tmp_path))
    assert not Path(pipe).parent.exists()  # its directory is gone


def test_refused_with_a_reason_without_the_driver_tool_or_on_an_exclusive_gpu(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    r = run(fake_bin(tmp_path / "a", with_control=False), "true")
    assert r.returncode == 2 and "nvidia-cuda-mps-control not found" in r.stderr
    r = run(fake_bin(tmp_path / "b", compute_mode="Exclusive_Process"), "true")
    assert r.returncode == 2 and "Exclusive_Process" in r.stderr
    assert not (tmp_path / "b" / "calls").exists()  # no daemon was started


def test_a_daemon_that_fails_to_start_is_an_error_and_the_command_never_runs(tmp_path):
    env = dict(fake_bin(tmp_path), FAKE_MPS_START_RC="1")
    marker = tmp_path / "ran"
    r = run(env, "touch", str(marker))
    assert r.returncode == 2 and "failed" in r.stderr
    assert not marker.exists()


def test_usage():
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage" in r.stderr
