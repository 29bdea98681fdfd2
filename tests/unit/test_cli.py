"""The CLI: help, exit codes, one-line user errors (real subprocesses)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ["serve", "bench", "replay", "record", "report", "dashboard", "check-config", "systemd-unit", "keys"]


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "hft_infer", *args], capture_output=True, text=True,
                          timeout=120, **kw)


def test_help_lists_every_subcommand():
    r = run("--help")
    assert r.returncode == 0
    for name in SUBCOMMANDS:
        assert name in r.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(name):
    r = run(name, "--help")
    assert r.returncode == 0 and "usage:" in r.stdout


def test_no_command_prints_help_and_exits_2():
    r = run()
    assert r.returncode == 2 and "usage:" in r.stdout


def test_check_config_default_exits_0():
    r = run("check-config", str(ROOT / "configs" / "default.toml"))
    assert r.returncode == 0 and "[scheduler]" in r.stdout


def test_check_config_misspelled_field_exits_2_naming_it(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "configs" / "default.toml").read_text().replace("max_age_us", "max_agee_us"))
    r = run("check-config", str(bad))
    assert r.returncode == 2
    assert "scheduler.max_agee_us: unknown field" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_check_config_missing_file_is_one_line():
    r = run("check-config", "/nonexistent.toml")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_bad_arguments_exit_2():
    r = run("bench", "--rate", "fast")
    assert r.returncode == 2 and "Traceback" not in r.stderr
