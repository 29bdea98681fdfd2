"""Generated units and the shipped template, checked by `systemd-analyze verify` where it exists.

`systemd-analyze verify` exits 0 on most mistakes (unknown keys, bad values)
and only prints them, so a unit passes here when the exit code is 0 *and*
nothing is printed about it. It needs the ExecStart binary to exist, so the
units point at the interpreter running the tests or the installed entry point.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hft_infer.app.systemd import default_exec, quote_arg, render_drop_in, render_unit, unit_spec
from hft_infer.config import load_config
from hft_infer.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "tools" / "systemd" / "hft-infer@.service"
ANALYZE = shutil.which("systemd-analyze")
CLI = [sys.executable, "-m", "hft_infer"]  # the `hft-infer` command
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")

PRODUCTION_LIKE = """
[service]
name = "hft-prod"
drain_timeout_ms = 3000
[ingest]
endpoint = "tcp://10.0.0.5:5555"
poll_mode = "busy"
[egress]
endpoint = "ipc:///srv/hft/decisions.sock"
[runner]
device = "cuda:0"
[cpu]
cores = [CORE]
rt_priority = 50
mlockall = true
[security]
allow_remote = true
"""


def make_sysfs(root: Path, *, isolated="", pci=None) -> str:
    """A fake two-node, 16-core /sys (see test_affinity for the planner's own cases)."""
    (root / "sys/devices/system/cpu").mkdir(parents=True)
    (root / "sys/devices/system/cpu/online").write_text("0-15\n")
    (root / "sys/devices/system/cpu/isolated").write_text(isolated + "\n")
    for node, cpus in ((0, "0-7"), (1, "8-15")):
        (root / f"sys/devices/system/node/node{node}").mkdir(parents=True)
        (root / f"sys/devices/system/node/node{node}/cpulist").write_text(cpus + "\n")
    for bdf, node in (pci or {}).items():
        (root / f"sys/bus/pci/devices/{bdf}").mkdir(parents=True)
        (root / f"sys/bus/pci/devices/{bdf}/numa_node").write_text(f"{node}\n")
    return str(root)


def verify(*paths: Path) -> list[str]:
    """Problems systemd-analyze reports (empty list = clean)."""
    r = subprocess.run([ANALYZE, "verify", "--man=no", *map(str, paths)], capture_output=True, text=True,
                       timeout=120)
    problems = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    if r.returncode != 0 and not problems:
        problems = [f"exit code {r.returncode}"]
    return problems


def config_file(tmp_path: Path, text: str = PRODUCTION_LIKE, core: int = 1) -> Path:
    path = tmp_path / "prod.toml"
    path.write_text(text.replace("CORE", str(core)))
    return path


def service_section(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    section = None
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def spec_for(path: Path, **kw):
    overrides = kw.pop("overrides", ())
    return unit_spec(load_config(str(path), overrides), config_path=str(path), overrides=overrides, **kw)


# --------------------------------------------------------------------------- content


@pytest.mark.parametrize("arg,quoted", [
    ("/usr/bin/hft-infer", "/usr/bin/hft-infer"),
    ("a b", '"a b"'),
    ("50%", "50%%"),
    ("$HOME", "$$HOME"),
    ('say "hi"', '"say \\"hi\\""'),
    ("", '""'),
])
def test_quote_arg(arg, quoted):
    assert quote_arg(arg) == quoted


def test_unit_carries_notify_watchdog_restart_placement_and_limits(tmp_path):
    path = config_file(tmp_path, core=9)
    text = render_unit(spec_for(path, sysfs_root=make_sysfs(tmp_path / "fake")))
    svc = service_section(text)
    assert svc["Type"] == ["notify"] and svc["NotifyAccess"] == ["main"]
    assert svc["Restart"] == ["on-failure"] and svc["WatchdogSec"] == ["10"]
    assert svc["TimeoutStopSec"] == ["13"]  # drain_timeout_ms 3000 + 10 s to flush
    exec_start = svc["ExecStart"][0]
    assert exec_start.startswith(default_exec()[0]) and f"serve -c {path.resolve()}" in exec_start
    assert svc["LimitMEMLOCK"] == ["infinity"] and svc["LimitRTPRIO"] == ["50"]
    assert svc["RestrictRealtime"] == ["no"]
    # the process mask: hot core 9 plus helper cores of its node, not the hot core alone
    # (libzmq's IO threads and the control process must not share the busy-polling core)
    assert svc["CPUAffinity"] == ["8-15"]
    assert svc["NUMAPolicy"] == ["bind"] and svc["NUMAMask"] == ["1"]
    assert "hot core 9, helper cores 8,10-15, NUMA node 1" in text
    assert svc["AmbientCapabilities"] == [""] and svc["CapabilityBoundingSet"] == [""]
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                       ("User", "hft-infer"), ("RuntimeDirectory", "hft-infer"), ("StateDirectory", "hft-infer")]:
        assert svc[key] == [value], key
    assert "PrivateDevices" not in svc  # would hide /dev/nvidia*
    assert svc["ReadWritePaths"] == ["-/srv/hft"]  # the bound ipc endpoint's directory
    assert "Wants=network-online.target" in text  # a tcp endpoint


def test_cpu_only_config_gets_private_devices_and_no_rt(tmp_path):
    path = config_file(tmp_path, "[runner]\ndevice = 'cpu'\n[cpu]\ncores = 'none'\n")
    svc = service_section(render_unit(spec_for(path)))
    assert svc["PrivateDevices"] == ["yes"] and svc["RestrictRealtime"] == ["yes"]
    assert "CPUAffinity" not in svc and "LimitRTPRIO" not in svc and "NUMAMask" not in svc


def test_auto_placement_resolves_gpu_node_from_sysfs(tmp_path):
    root = make_sysfs(tmp_path / "fake", isolated="6-7,14-15", pci={"0000:19:00.0": 1})
    path = config_file(tmp_path, "[runner]\ndevice = 'cuda:1'\n[cpu]\ncores = 'auto'\n")
    spec = spec_for(path, shard="1/2", sysfs_root=root, gpu_pci="0000:19:00.0")
    svc = service_section(render_unit(spec))
    # shard 1 takes the second isolated core of the GPU's node 1; helpers: node 1's non-isolated cores
    assert svc["CPUAffinity"] == ["8-13,15"] and svc["NUMAMask"] == ["1"]
    assert "hot core 15" in " ".join(spec.comments)
    assert "--shard 1/2" in svc["ExecStart"][0]


def test_a_shard_alone_on_its_host_gets_the_first_core_in_its_unit(tmp_path):
    """cpu.host_shards = [1]: shard 1 of 2 deployed on a host of its own takes that host's first
    isolated core (slot 0 of 1), not slot 1's; --shard naming a shard the list leaves out is refused."""
    root = make_sysfs(tmp_path / "fake", isolated="6-7,14-15", pci={"0000:19:00.0": 1})
    path = config_file(tmp_path, "[runner]\ndevice = 'cuda:1'\n[universe]\nshard_index = 1\nshard_count = 2\n"
                                 "[cpu]\ncores = 'auto'\nhost_shards = [1]\n")
    spec = spec_for(path, sysfs_root=root, gpu_pci="0000:19:00.0")
    assert "hot core 14" in " ".join(spec.comments)
    with pytest.raises(UserError, match="--shard 0/2: shard 0 is not among cpu.host_shards"):
        spec_for(path, shard="0/2", sysfs_root=root, gpu_pci="0000:19:00.0")


def test_instance_unit_has_per_instance_directories(tmp_path):
    svc = service_section(render_unit(spec_for(config_file(tmp_path), instance="gpu0")))
    for key in ("RuntimeDirectory", "StateDirectory", "LogsDirectory"):
        assert svc[key] == ["hft-infer/gpu0"]


def test_paths_in_home_relax_protect_home_with_a_warning(tmp_path):
    spec = spec_for(config_file(tmp_path), exec_cmd=["/home/alice/venv/bin/hft-infer"])
    assert spec.protect_home == "read-only"
    assert any("/home/alice/venv/bin/hft-infer under a home directory" in w for w in spec.warnings)


def test_overrides_reach_exec_start_escaped(tmp_path):
    spec = spec_for(config_file(tmp_path), overrides=["model.checkpoint=/opt/m 1%.pt"])
    assert '--set "model.checkpoint=/opt/m 1%%.pt"' in service_section(render_unit(spec))["ExecStart"][0]


# --------------------------------------------------------------------------- systemd-analyze verify


@needs_analyze
def test_generated_unit_passes_systemd_analyze_verify(tmp_path):
    unit = tmp_path / "hft-prod.service"
    unit.write_text(render_unit(spec_for(config_file(tmp_path))))
    assert verify(unit) == []


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path):
    """The check above is not vacuous: a bad value is reported."""
    unit = tmp_path / "hft-prod.service"
    unit.write_text(render_unit(spec_for(config_file(tmp_path))).replace("NUMAPolicy=bind", "NUMAPolicy=tight"))
    problems = verify(unit)
    assert any("NUMA policy" in p for p in problems), problems


@needs_analyze
@pytest.mark.parametrize("name", ["default.toml", "production.toml"])
def test_shipped_configs_give_units_that_verify(tmp_path, name):
    path = ROOT / "configs" / name
    if not path.exists():
        pytest.skip(f"configs/{name} is not in this checkout")
    r = subprocess.run([*CLI, "systemd-unit", "-c", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    unit = tmp_path / "hft-infer.service"
    unit.write_text(r.stdout)
    assert verify(unit) == []


def _installable_template(tmp_path: Path) -> Path:
    """The template with its ExecStart binary swapped for one that exists here."""
    text = TEMPLATE.read_text()
    assert "ExecStart=/opt/hft-infer/venv/bin/hft-infer serve -c /etc/hft-infer/%i.toml" in text
    unit = tmp_path / "hft-infer@.service"
    unit.write_text(text.replace("/opt/hft-infer/venv/bin/hft-infer", default_exec()[0]))
    return unit


@needs_analyze
def test_template_and_an_instance_verify(tmp_path):
    unit = _installable_template(tmp_path)
    assert verify(unit, tmp_path / "hft-infer@gpu0.service") == []


@needs_analyze
def test_drop_in_on_the_template_verifies(tmp_path):
    _installable_template(tmp_path)
    drop_dir = tmp_path / "hft-infer@gpu0.service.d"
    drop_dir.mkdir()
    spec = spec_for(config_file(tmp_path), instance="gpu0")
    (drop_dir / "hft-infer.conf").write_text(render_drop_in(spec))
    assert verify(tmp_path / "hft-infer@gpu0.service") == []
    # and verify does read it: a bad line in the drop-in is reported
    (drop_dir / "hft-infer.conf").write_text(render_drop_in(spec) + "WatchdogSec=soon\n")
    assert any("WatchdogSec" in p or "sec value" in p for p in verify(tmp_path / "hft-infer@gpu0.service"))


def test_template_matches_the_generator(tmp_path):
    """The hand-written template keeps the generator's settings (only placement, which
    the per-instance drop-in adds, and the instance paths differ)."""
    generated = service_section(render_unit(spec_for(
        config_file(tmp_path, "[cpu]\ncores = 'none'\n[runner]\ndevice = 'cuda:0'\n"), instance="INST",
        exec_cmd=["/opt/hft-infer/venv/bin/hft-infer"])))
    template = service_section(TEMPLATE.read_text())
    for key, values in generated.items():
        if key == "ExecStart":
            continue
        assert template.get(key) == [v.replace("INST", "%i") for v in values], key
    assert set(template) - set(generated) == set()


def test_cli_prints_a_unit_and_refuses_drop_in_without_instance(tmp_path):
    path = config_file(tmp_path)
    cli = [*CLI, "systemd-unit", "-c", str(path)]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and re.search(r"^Type=notify$", r.stdout, re.M)
    r = subprocess.run([*cli, "--drop-in"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--instance" in r.stderr
    r = subprocess.run([*cli, "--instance", "a/b"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_a_remote_control_endpoint_also_waits_for_the_network(tmp_path):
    path = config_file(tmp_path, "[runner]\ndevice = 'cpu'\n[cpu]\ncores = 'none'\n[security]\nallow_remote = true\n"
                                 "[metrics]\ncontrol_endpoint = 'tcp://10.0.0.9:7000'\n")
    text = render_unit(spec_for(path))
    assert "Wants=network-online.target" in text and "After=network-online.target" in text


MPS_UNIT = ROOT / "tools" / "systemd" / "hft-infer-mps.service"
MPS_DROP_IN = ROOT / "tools" / "systemd" / "mps.conf"


def _environment(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            env.update(item.split("=", 1) for item in line[len("Environment="):].split())
    return env


def test_the_shards_find_the_mps_daemon_where_their_sandbox_lets_them():
    """The shards run with PrivateTmp (the driver's default /tmp/nvidia-mps is hidden from them),
    so the MPS unit puts its pipes under /run and the drop-in points the shards there and lets them
    write to it."""
    assert "PrivateTmp=yes" in TEMPLATE.read_text() and "ProtectSystem=strict" in TEMPLATE.read_text()
    daemon, shard = _environment(MPS_UNIT.read_text()), _environment(MPS_DROP_IN.read_text())
    pipe = daemon["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe.startswith("/run/") and shard["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert shard["CUDA_MPS_LOG_DIRECTORY"] == daemon["CUDA_MPS_LOG_DIRECTORY"]
    assert f"RuntimeDirectory={pipe.removeprefix('/run/')}" in MPS_UNIT.read_text()
    assert f"ReadWritePaths=-{pipe}" in MPS_DROP_IN.read_text()  # "-": a missing daemon is not a sandbox failure
    assert "After=hft-infer-mps.service" in MPS_DROP_IN.read_text()
    assert "PartOf=hft-infer-mps.service" in MPS_DROP_IN.read_text()  # a daemon restart takes the shards along
    # MPS serves one user's clients: the daemon runs as the shards' user
    assert service_section(MPS_UNIT.read_text())["User"] == service_section(TEMPLATE.read_text())["User"]


@needs_analyze
def test_the_mps_unit_and_the_template_with_its_drop_in_verify(tmp_path):
    _installable_template(tmp_path)
    mps = tmp_path / "hft-infer-mps.service"
    mps.write_text(MPS_UNIT.read_text().replace("/usr/bin/nvidia-cuda-mps-control", "/bin/true"))
    drop_dir = tmp_path / "hft-infer@gpu0.service.d"
    drop_dir.mkdir()
    (drop_dir / "mps.conf").write_text(MPS_DROP_IN.read_text())
    assert verify(mps) == []
    assert verify(tmp_path / "hft-infer@gpu0.service") == []
