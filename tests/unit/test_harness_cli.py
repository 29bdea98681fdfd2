"""bench and replay: bad input is one line on stderr and exit code 2, before any run starts (real subprocesses)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(*args, tmp_path):
    return subprocess.run([sys.executable, "-m", "hft_infer", *args, "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)


def _garbage(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"this is not a checkpoint")
    return path


@pytest.mark.parametrize("args, says", [
    (["bench", "--set", 'model.checkpoint="/nonexistent/m.safetensors"'], "no such file"),
    (["bench", "--set", 'model.checkpoint="GARBAGE"'], "not a safetensors file"),
    (["replay", "synthetic", "--start-service", "--set", 'model.checkpoint="/nonexistent/m.safetensors"'],
     "no such file"),
    (["replay", "synthetic", "--events", "-10"], "--events must be >= 1 (got -10)"),
    (["replay", "synthetic", "--rate", "0"], "--rate must be > 0"),
    (["replay", "synthetic", "--levels", "0"], "--levels must be >= 1"),
    (["replay", "synthetic", "--instruments", "0"], "--instruments must be >= 1"),
    (["replay", "synthetic", "--tolerance", "-1"], "--tolerance must be >= 0"),
    (["bench", "--rate", "-5"], "--rate must be > 0 (got -5)"),
    (["bench", "--duration", "0"], "--duration must be > 0"),
    (["bench", "--warmup", "-1"], "--warmup must be >= 0"),
    (["bench", "--instruments", "0"], "--instruments must be >= 1"),
    (["bench", "--collectors", "0"], "--collectors must be >= 1"),
    (["bench", "--null-delay-us", "-3"], "--null-delay-us must be >= 0"),
    (["bench", "--json", "/nonexistent-dir/out.json"], "directory /nonexistent-dir does not exist"),
    (["replay", "synthetic", "--json", "/nonexistent-dir/out.json"], "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_run(args, says, tmp_path):
    args = [a.replace("GARBAGE", str(_garbage(tmp_path))) for a in args]
    r = run(*args, tmp_path=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr
    assert lines[0].startswith(f"hft-infer {args[0]}: error:")


def test_json_into_a_directory_is_refused_before_the_run(tmp_path):
    r = run("bench", "--json", str(tmp_path), tmp_path=tmp_path)
    assert r.returncode == 2 and "is a directory" in r.stderr and "generating" not in r.stderr


def test_floor_options_exclude_each_other(tmp_path):
    r = run("bench", "--null-service", "--with-floor", tmp_path=tmp_path)
    assert r.returncode == 2 and "not allowed with" in r.stderr
