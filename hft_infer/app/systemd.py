"""`hft-infer systemd-unit`: a systemd unit (or drop-in) for a config.

The unit follows the config: `Type=notify` (READY after warm-up and graph
capture; WATCHDOG=1 from the loop's housekeeping; STOPPING=1 on SIGTERM, see
`sdnotify`), CPU and NUMA placement from `[cpu]` resolved on this host by the
same planner the service uses at start (`affinity.plan_placement`), resource
limits instead of capabilities, and sandboxing that still lets a CUDA process
run. Every choice that is not obvious carries a comment in the output, since
the unit is read by operators more than by this code.

Naming: without `--instance` the unit is `<service.name>.service`; with
`--instance NAME` it is `hft-infer@NAME.service`, a complete unit that takes
precedence over the shipped template `tools/systemd/hft-infer@.service` for
that instance; with `--instance NAME --drop-in` only the config-specific
settings are printed, for `/etc/systemd/system/hft-infer@NAME.service.d/`
on top of the template.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hft_infer.affinity import SysFs, format_cpulist, plan_placement
from hft_infer.config import load_config
from hft_infer.errors import UserError
from hft_infer.placement import host_slot
from hft_infer.transport.sockets import is_local_endpoint

_INSTANCE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SHARD = re.compile(r"^(\d+)/(\d+)$")
_HOME_DIRS = ("/home", "/root", "/run/user")
DEFAULT_WATCHDOG_S = 10
DEFAULT_START_TIMEOUT_S = 300  # first start compiles Triton kernels: minutes on a cold cache


def quote_arg(arg: str) -> str:
    """One ExecStart= argument: `%` and `$` escaped (systemd expands both), quoted when needed."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not re.search(r'[\s"\'\\;]', arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def default_exec() -> list[str]:
    """The installed `hft-infer` entry point next to this interpreter, on PATH, or
    `python -m hft_infer` (ExecStart= needs an absolute path)."""
    beside = Path(sys.executable).parent / "hft-infer"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("hft-infer")
    if found:
        return [str(Path(found).absolute())]
    return [sys.executable, "-m", "hft_infer"]


@dataclass
class UnitSpec:
    """What the unit renders from; built by `unit_spec` from a config."""

    name: str
    description: str
    exec_start: list[str]
    user: str
    group: str
    dir_suffix: str
    """"hft-infer" or "hft-infer/<instance>": per-instance runtime/state dirs (systemd removes a
    RuntimeDirectory when its unit stops, so instances must not share one)."""
    watchdog_s: int
    start_timeout_s: int
    stop_timeout_s: int
    cpu_affinity: list[int] = field(default_factory=list)
    numa_node: int | None = None
    rt_priority: int = 0
    gpu: bool = True
    network: bool = False
    read_write_paths: list[str] = field(default_factory=list)
    protect_home: str = "yes"
    comments: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _endpoint_dirs(cfg) -> list[str]:
    """Directories that ipc endpoints bound by this service live in (outside its runtime dir)."""
    out = []
    for template, binds in ((cfg.ingest.endpoint, cfg.ingest.bind), (cfg.egress.endpoint, cfg.egress.bind),
                            (cfg.metrics.control_endpoint, True)):
        if template.startswith("ipc://") and "{runtime_dir}" not in template and binds:
            path = template[len("ipc://"):]
            if not path.startswith("@"):
                out.append(str(Path(path).parent))
    return out


def unit_spec(cfg, *, config_path: str, instance: str | None = None, shard: str | None = None,
              overrides: list[str] | tuple[str, ...] = (), user: str = "hft-infer", group: str | None = None,
              exec_cmd: list[str] | None = None, sysfs_root: str = "/", gpu_pci: str | None = None) -> UnitSpec:
    """Everything the unit says about this config; `sysfs_root`/`gpu_pci` as in affinity.plan_placement."""
    if instance is not None and not _INSTANCE.match(instance):
        raise UserError(f"--instance {instance!r}: use letters, digits, '.', '_' or '-'")
    if shard is not None:
        m = _SHARD.match(shard)
        if not m or int(m.group(1)) >= int(m.group(2)):
            raise UserError(f"--shard {shard!r}: expected I/N with 0 <= I < N")
    if not config_path.startswith("builtin:"):
        config_path = str(Path(config_path).resolve())
    exec_cmd = list(exec_cmd or default_exec())
    if not os.path.isabs(exec_cmd[0]):
        raise UserError(f"--exec {exec_cmd[0]!r}: ExecStart needs an absolute path")

    args = [*exec_cmd, "serve", "-c", config_path]
    if shard:
        args += ["--shard", shard]
    for item in overrides:
        args += ["--set", item]

    name = f"hft-infer@{instance}.service" if instance else f"{cfg.service.name}.service"
    what = f"instance {instance}" if instance else cfg.service.name
    spec = UnitSpec(
        name=name,
        description=f"hft-infer model inference on a market-data stream ({what})",
        exec_start=args, user=user, group=group or user,
        dir_suffix=f"hft-infer/{instance}" if instance else "hft-infer",
        watchdog_s=int(getattr(cfg.service, "watchdog_s", DEFAULT_WATCHDOG_S)),
        start_timeout_s=int(getattr(cfg.service, "start_timeout_s", DEFAULT_START_TIMEOUT_S)),
        # drain, then flush histograms and stop the control process
        stop_timeout_s=cfg.service.drain_timeout_ms // 1000 + 10,
        rt_priority=cfg.cpu.rt_priority,
        gpu=cfg.runner.device != "cpu",
    )

    # Placement, resolved here with the service's own planner. The unit's
    # CPUAffinity= is the whole process's starting mask: the hot core plus the
    # helper cores (the service pins its hot thread to the hot core itself).
    # Setting it to the hot core alone would put libzmq's IO threads and the
    # control process on the busy-polling core, which starves them.
    if cfg.cpu.cores != "none":
        online = SysFs(sysfs_root).online()
        index, count = (map(int, shard.split("/")) if shard
                        else (cfg.universe.shard_index, cfg.universe.shard_count))
        try:
            slot, count = host_slot(cfg.cpu, index, count)
        except ValueError as e:  # --shard names a shard the config's cpu.host_shards leaves out
            raise UserError(f"--shard {shard}: {e}") from None
        plan = plan_placement(cfg.cpu, cfg.runner.device, slot=slot, shards=count, sysfs_root=sysfs_root,
                              inherited=online, gpu_pci=gpu_pci, use_torch=False)
        for step in plan.steps:
            if step.outcome == "refused":
                spec.warnings.append(f"cpu: {step.detail}")
        spec.warnings.extend(f"cpu: {w}" for w in plan.warnings
                             if not w.startswith("no isolated cores"))
        if plan.hot_cores:
            spec.cpu_affinity = sorted(set(plan.hot_cores) | set(plan.helper_cores))
            spec.numa_node = plan.numa_node
            spec.comments.append(
                f"placement (resolved on {socket.gethostname()}; regenerate on the host that runs it): "
                f"hot core {format_cpulist(plan.hot_cores)}, helper cores {format_cpulist(plan.helper_cores) or '-'}, "
                f"NUMA node {plan.numa_node if plan.numa_node is not None else 'unknown'}"
                + (f", GPU {plan.gpu_pci}" if plan.gpu_pci else ""))
    else:
        spec.comments.append("placement: cpu.cores = \"none\": no CPUAffinity/NUMA settings")

    spec.network = any(not is_local_endpoint(ep) for ep in (cfg.ingest.endpoint, cfg.egress.endpoint,
                                                            cfg.metrics.control_endpoint))
    rw = list(dict.fromkeys(_endpoint_dirs(cfg)))
    if cfg.service.run_dir:
        run_dir = cfg.service.run_dir
        if os.path.isabs(run_dir):
            rw.append(run_dir)
        else:
            spec.comments.append(f"service.run_dir {run_dir!r} is relative: it lands under WorkingDirectory")
    spec.read_write_paths = rw

    needed = [exec_cmd[0], config_path, cfg.security.curve_server_secret, cfg.security.curve_authorized_dir,
              cfg.security.curve_feed_public, *rw]
    in_home = [p for p in needed if p and any(p == h or p.startswith(h + "/") for h in _HOME_DIRS)]
    if in_home:
        spec.protect_home = "read-only"
        spec.warnings.append(
            f"{', '.join(in_home)} under a home directory: ProtectHome=read-only instead of yes, and user "
            f"{user} must be able to read it; install under /opt/hft-infer and /etc/hft-infer instead")
    in_tmp = [p for p in needed if p and any(p.startswith(t + "/") for t in ("/tmp", "/var/tmp"))]
    if in_tmp:
        spec.warnings.append(f"{', '.join(in_tmp)} under /tmp: the service has a private /tmp "
                             "(PrivateTmp=yes) and will not see it")
    return spec


def _lines_placement(spec: UnitSpec) -> list[str]:
    out = [f"# {c}" for c in spec.comments]
    if spec.cpu_affinity:
        out.append(f"CPUAffinity={format_cpulist(spec.cpu_affinity)}")
    if spec.numa_node is not None:
        out += [
            "# Memory from the hot core's (GPU's) node only: everything is allocated at start,",
            "# so a node that cannot hold it fails the start instead of going remote later.",
            "NUMAPolicy=bind",
            f"NUMAMask={spec.numa_node}",
        ]
    out += [
        "# Resource limits instead of capabilities: LimitMEMLOCK lets an unprivileged user",
        "# mlockall (cpu.mlockall) and pin host memory; LimitRTPRIO allows SCHED_FIFO up to it.",
        "LimitMEMLOCK=infinity",
    ]
    if spec.rt_priority > 0:
        out += [
            f"LimitRTPRIO={spec.rt_priority}",
            "# The service sets SCHED_FIFO on its hot thread only; CPUSchedulingPolicy= would",
            "# make every thread real-time.",
            "RestrictRealtime=no",
        ]
    else:
        out.append("RestrictRealtime=yes")
    return out


def _lines_timing(spec: UnitSpec) -> list[str]:
    out = [
        "# READY=1 comes after warm-up and CUDA graph capture; a cold Triton cache takes minutes.",
        f"TimeoutStartSec={spec.start_timeout_s}",
        f"TimeoutStopSec={spec.stop_timeout_s}",
    ]
    if spec.watchdog_s > 0:
        out += ["# The hot loop's housekeeping sends WATCHDOG=1; a wedged loop is killed and restarted.",
                f"WatchdogSec={spec.watchdog_s}"]
    return out


def render_unit(spec: UnitSpec, *, command_line: str = "") -> str:
    q = quote_arg
    d = spec.dir_suffix
    head = [
        f"# {spec.name}: generated by `hft-infer systemd-unit{(' ' + command_line) if command_line else ''}`",
        f"# Install: /etc/systemd/system/{spec.name}, then: systemctl daemon-reload && "
        f"systemctl enable --now {spec.name}",
        f"# Needs the user: useradd --system --no-create-home --shell /usr/sbin/nologin {spec.user}",
        *(f"# warning: {w}" for w in spec.warnings),
    ]
    unit = ["[Unit]", f"Description={spec.description}"]
    if spec.network:
        unit += ["Wants=network-online.target", "After=network-online.target"]
    else:
        unit += ["After=network.target"]
    unit += ["# Stop restarting a unit that crashes 5 times in a minute (a config or hardware fault).",
             "StartLimitIntervalSec=60", "StartLimitBurst=5"]

    svc = [
        "[Service]",
        "Type=notify",
        "# Only the main process may notify: the control process must not report READY for it.",
        "NotifyAccess=main",
        "ExecStart=" + " ".join(q(a) for a in spec.exec_start),
        "Restart=on-failure",
        "RestartSec=2",
        "# SIGTERM to the main process only: it drains, publishes the last decisions, flushes",
        "# the histograms and then stops its control process; leftovers get SIGKILL at the timeout.",
        "KillMode=mixed",
        *_lines_timing(spec),
        "",
        f"User={spec.user}",
        f"Group={spec.group}",
        "# Sockets and files readable by the group: add clients (collectors) to it.",
        "UMask=0007",
        f"# $RUNTIME_DIRECTORY=/run/{d}: the ipc sockets ({{runtime_dir}} in endpoints).",
        f"RuntimeDirectory={d}",
        "RuntimeDirectoryMode=0750",
        "# Run directories (summary JSON, histograms) default to runs/ under the state dir.",
        f"StateDirectory={d}",
        f"WorkingDirectory=/var/lib/{d}",
        f"LogsDirectory={d}",
        "CacheDirectory=hft-infer",
        "# Caches the sandbox would otherwise refuse to write ($HOME is not writable).",
        "Environment=PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 XDG_CACHE_HOME=/var/cache/hft-infer",
        "Environment=TRITON_CACHE_DIR=/var/cache/hft-infer/triton CUDA_CACHE_PATH=/var/cache/hft-infer/nv",
        "",
        *_lines_placement(spec),
        "",
        "# Sandbox. Not set, on purpose: PrivateDevices/DevicePolicy/ProtectClock (they hide or",
        "# filter /dev/nvidia*), MemoryDenyWriteExecute (Triton and the CUDA driver JIT code),",
        "# SystemCallFilter (the CUDA driver's ioctls are not in any preset group).",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "ProtectSystem=strict",
        f"ProtectHome={spec.protect_home}",
        "PrivateTmp=yes",
    ]
    if not spec.gpu:
        svc.append("PrivateDevices=yes")
    svc += [
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectHostname=yes",
        "RestrictSUIDSGID=yes",
        "RestrictNamespaces=yes",
        "LockPersonality=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "SystemCallArchitectures=native",
    ]
    if spec.read_write_paths:
        svc += ["# Directories of ipc endpoints bound outside the runtime dir, and service.run_dir",
                "# ('-': no error if missing).",
                "ReadWritePaths=" + " ".join("-" + p for p in spec.read_write_paths)]
    install = ["[Install]", "WantedBy=multi-user.target"]
    return "\n".join([*head, "", *unit, "", *svc, "", *install]) + "\n"


def render_drop_in(spec: UnitSpec, *, command_line: str = "") -> str:
    """Config-specific settings on top of tools/systemd/hft-infer@.service."""
    q = quote_arg

    lines = [
        f"# {spec.name}.d/hft-infer.conf: generated by `hft-infer systemd-unit"
        f"{(' ' + command_line) if command_line else ''}`",
        f"# Install: /etc/systemd/system/{spec.name}.d/hft-infer.conf, then: systemctl daemon-reload",
        *(f"# warning: {w}" for w in spec.warnings),
        "",
        "[Service]",
        "# An empty ExecStart= clears the template's before setting this one.",
        "ExecStart=",
        "ExecStart=" + " ".join(q(a) for a in spec.exec_start),
        *_lines_timing(spec),
        *_lines_placement(spec),
    ]
    if spec.read_write_paths:
        lines.append("ReadWritePaths=" + " ".join("-" + p for p in spec.read_write_paths))
    if spec.protect_home != "yes":
        lines.append(f"ProtectHome={spec.protect_home}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI


def main(args: argparse.Namespace) -> int:
    if args.drop_in and not args.instance:
        raise UserError("--drop-in needs --instance NAME (it adds to the hft-infer@.service template)")
    cfg = load_config(args.config, args.overrides)
    spec = unit_spec(cfg, config_path=args.config, instance=args.instance, shard=args.shard,
                     overrides=args.overrides, user=args.user, group=args.group,
                     exec_cmd=[str(Path(args.exec_path).absolute())] if args.exec_path else None)
    command_line = shlex.join(["-c", spec.exec_start[spec.exec_start.index("-c") + 1],
                             *(["--instance", args.instance] if args.instance else []),
                             *(["--shard", args.shard] if args.shard else []),
                             *(a for item in args.overrides for a in ("--set", item))])
    text = render_drop_in(spec, command_line=command_line) if args.drop_in else render_unit(
        spec, command_line=command_line)
    sys.stdout.write(text)
    for w in spec.warnings:
        print(f"hft-infer systemd-unit: warning: {w}", file=sys.stderr)
    return 0
