"""The CLI: help, exit codes, one-line user errors (real subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ["serve", "bench", "replay", "record", "report", "dashboard", "check-config", "systemd-unit", "keys",
               "shard-plan", "train"]


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


@pytest.mark.parametrize("shard, says", [
    ("2/3", "--shard 2/3: universe: `shard_count` 3 exceeds the universe's 2 instruments: a shard would serve none"),
    ("3/3", "--shard '3/3': need 0 <= I < N"),
    ("half", "--shard 'half': expected I/N"),
])
def test_a_shard_that_would_serve_nothing_is_refused_naming_the_shard(shard, says, tmp_path):
    r = run("serve", "--shard", shard, "--set", "universe.instruments=2", "--no-control", "--run-dir",
            str(tmp_path / "run"))
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# --------------------------------------------------------------------------- check-config checks what serve refuses


def _check_config(capsys, monkeypatch, tmp_path, *args: str) -> tuple[int, str, str]:
    """The real CLI in this process (`hft_infer.app.cli.main`), on a private runtime dir."""
    from hft_infer.app.cli import main

    monkeypatch.setenv("HFT_INFER_RUNTIME_DIR", str(tmp_path))
    rc = main(["check-config", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_check_config_prints_the_config_resolved(capsys, monkeypatch, tmp_path):
    from hft_infer.config import load_config

    rc, out, err = _check_config(capsys, monkeypatch, tmp_path, "--set", "service.name=shard-2")
    assert rc == 0, err
    assert f'endpoint = "ipc://{tmp_path}/shard-2-md.sock"' in out
    assert f'control_endpoint = "ipc://{tmp_path}/shard-2-control.sock"' in out
    body = [line for line in out.splitlines() if not line.startswith("#")]
    assert not [line for line in body if "{runtime_dir}" in line or "{name}" in line]
    printed = tmp_path / "printed.toml"
    printed.write_text(out)
    assert load_config(str(printed)).ingest.endpoint == f"ipc://{tmp_path}/shard-2-md.sock"  # it loads back


# the endpoint forms serve refuses without CURVE or security.allow_remote (test_sockets has the full list);
# "*" only binds (egress), a source address only connects (ingest, control)
REMOTE = ["tcp://0.0.0.0:5556", "tcp://[::]:5556", "tcp://10.0.0.5:5556", "tcp://eth0:5556",
          "tcp://feed.example.com:5556", "tcp://[2001:db8::1]:5556", "tcp://2130706433:5556",
          "epgm://eth0;239.1.1.1:5556", "udp://10.0.0.5:5556", "ws://127.0.0.1:5556"]
CONNECTING = ("ingest.endpoint", "metrics.control_endpoint")
REMOTE_CASES = ([(field, ep) for field in (*CONNECTING, "egress.endpoint") for ep in REMOTE]
                + [("egress.endpoint", "tcp://*:5556")]
                + [(field, "tcp://127.0.0.1;10.0.0.5:5556") for field in CONNECTING])


@pytest.mark.parametrize("field, endpoint", REMOTE_CASES)
def test_check_config_refuses_non_loopback_endpoints(capsys, monkeypatch, tmp_path, field, endpoint):
    rc, out, err = _check_config(capsys, monkeypatch, tmp_path, "--set", f'{field}="{endpoint}"')
    assert rc == 2 and out == ""
    assert err.startswith(f"hft-infer check-config: error: {field} {endpoint} is not loopback"), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("field, endpoint, fragment", [
    ("ingest.endpoint", "tcp://127.0.0.1", "no port"),
    ("egress.endpoint", "tcp://[::1]", "no port"),
    ("metrics.control_endpoint", "tcp://127.0.0.1", "no port"),
    ("ingest.endpoint", "tcp://127.0.0.1:0", "a connecting socket needs a host and a port"),
    ("egress.endpoint", "ipc:///" + "d" * 110 + ".sock", "the kernel allows 107"),
])
def test_check_config_refuses_malformed_endpoints(capsys, monkeypatch, tmp_path, field, endpoint, fragment):
    rc, _, err = _check_config(capsys, monkeypatch, tmp_path, "--set", f'{field}="{endpoint}"')
    assert rc == 2 and err.startswith(f"hft-infer check-config: error: {field}: ") and fragment in err, err


def test_check_config_refuses_a_missing_checkpoint(capsys, monkeypatch, tmp_path):
    missing = tmp_path / "nope.safetensors"
    rc, _, err = _check_config(capsys, monkeypatch, tmp_path, "--set", f'model.checkpoint="{missing}"')
    assert rc == 2 and f"error: model: {missing}: cannot read: no such file" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: nothing is unreadable")
def test_check_config_refuses_an_unreadable_checkpoint(capsys, monkeypatch, tmp_path):
    from hft_infer.models.checkpoint import builtin_path

    ckpt = tmp_path / "m.safetensors"
    ckpt.write_bytes(builtin_path("default").read_bytes())
    ckpt.chmod(0)
    rc, _, err = _check_config(capsys, monkeypatch, tmp_path, "--set", f'model.checkpoint="{ckpt}"')
    assert rc == 2 and "permission denied" in err


def test_check_config_typo_is_blamed_on_its_set_with_a_suggestion():
    r = run("check-config", "--set", "scheduler.max_wiat_us=3")
    assert r.returncode == 2
    assert r.stderr.strip() == ("hft-infer check-config: error: --set scheduler.max_wiat_us=3: "
                                "scheduler.max_wiat_us: unknown field (did you mean max_wait_us?)")


def test_keys_check_reports_the_control_endpoint(tmp_path):
    r = run("keys", "check", "--set", f'metrics.control_endpoint="ipc://{tmp_path}/c.sock"')
    assert r.returncode == 0, r.stderr
    assert f"control ipc://{tmp_path}/c.sock: plain (ipc/loopback)" in r.stdout
    r = run("keys", "check", "--set", 'metrics.control_endpoint="tcp://10.0.0.5:7000"')
    assert r.returncode == 2 and "metrics.control_endpoint tcp://10.0.0.5:7000 is not loopback" in r.stderr
