"""CPU placement of the hot thread: cores, real-time priority, locked memory, frozen GC.

Two halves. `plan_placement` is pure: it reads sysfs (and, for a GPU, the
device's PCI address) and decides where the hot thread and everything else go.
`apply_placement` / `finish_warmup` make the system calls and record each
step as applied or refused, so that one start-up block (`log_block`) and one
`/metrics` info series (`as_labels`) say what the process actually runs with.

Order of calls in the service (why each one is where it is):

    plan = plan_placement(cfg.cpu, cfg.runner.device, slot=cfg.universe.shard_index)
    ctx = zmq.Context()
    zmq_step = configure_zmq_context(ctx, plan)     # before the first socket: IO threads
                                                    # start then and keep their mask
    report = apply_placement(plan, strict=cfg.cpu.strict, steps=[zmq_step])
                                                    # before allocating: first-touch pages
                                                    # land on the hot core's NUMA node
    ... allocate, warm up, capture graphs ...
    finish_warmup(report, strict=cfg.cpu.strict)    # move threads born during warm-up
                                                    # (CUDA, Triton) off the hot core;
                                                    # gc.freeze()
    log.info(report.log_block()); notifier.ready()

Threads inherit the affinity of the thread that creates them, so every helper
thread started after the hot thread is pinned would share its core; a
busy-polling thread starves a libzmq IO thread that shares its core (p99.9 of
4 ms measured on the H200 host, see DESIGN.md). Hence the helper core set,
`configure_zmq_context`, and the sweep of the process's other threads.

Nothing here is imported on the hot path; torch is imported only to find a
CUDA device's PCI address, and only when the device is CUDA.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import zmq

from hft_infer.config import ConfigError

Outcome = Literal["applied", "refused", "skipped", "planned"]

_CPULIST_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


# --------------------------------------------------------------------------- cpulists


def parse_cpulist(text: str) -> list[int]:
    """Parse the kernel's cpulist format ("0-3,8,10-11", "" = none; "0-15:4" = stride).

    Raises ValueError on anything else, so a corrupt sysfs file is not read as
    "no cores".
    """
    out: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for item in text.split(","):
        m = _CPULIST_ITEM.match(item.strip())
        if not m:
            raise ValueError(f"bad cpulist item {item!r} in {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo or step < 1:
            raise ValueError(f"bad cpulist range {item!r} in {text!r}")
        out.update(range(lo, hi + 1, step))
    return sorted(out)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The inverse of parse_cpulist: sorted, ranges collapsed ("0-3,8")."""
    items = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


# --------------------------------------------------------------------------- sysfs


class SysFs:
    """Read-only view of the files placement needs, under a root (tests use fake trees)."""

    def __init__(self, root: str = "/") -> None:
        self.root = root

    def _read(self, rel: str) -> str | None:
        try:
            with open(os.path.join(self.root, rel.lstrip("/"))) as f:
                return f.read()
        except OSError:
            return None

    def online(self) -> list[int]:
        text = self._read("sys/devices/system/cpu/online")
        if text is None:  # no sysfs (unusual container): trust the CPU count
            return list(range(os.cpu_count() or 1))
        return parse_cpulist(text)

    def isolated(self) -> list[int]:
        text = self._read("sys/devices/system/cpu/isolated")
        return parse_cpulist(text) if text else []

    def nodes(self) -> dict[int, list[int]]:
        """NUMA node -> its cores; {} when the kernel exposes no node directory."""
        base = os.path.join(self.root, "sys/devices/system/node")
        out: dict[int, list[int]] = {}
        try:
            names = os.listdir(base)
        except OSError:
            return out
        for name in names:
            m = re.fullmatch(r"node(\d+)", name)
            if m:
                text = self._read(f"sys/devices/system/node/{name}/cpulist")
                if text is not None:
                    out[int(m.group(1))] = parse_cpulist(text)
        return out

    def pci_numa_node(self, bdf: str) -> int | None:
        """The NUMA node of a PCI device; None when unknown (missing, or -1 on one-node hosts)."""
        text = self._read(f"sys/bus/pci/devices/{bdf}/numa_node")
        if text is None:
            return None
        node = int(text.strip())
        return node if node >= 0 else None

    def cpuset(self) -> list[int] | None:
        """Cores this process's cgroup may use (cgroup v2 or v1 cpuset); None if unreadable.

        sched_setaffinity can reach any core in the cpuset, even one outside
        the inherited affinity mask: with isolcpus= the inherited mask of a
        shell excludes the isolated cores, yet pinning onto them works.
        """
        text = self._read("proc/self/cgroup")
        if text is None:
            return None
        for line in text.splitlines():
            hier, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if hier == "0" and controllers == "":
                rel = f"sys/fs/cgroup/{path.strip('/')}/cpuset.cpus.effective"
            elif "cpuset" in controllers.split(","):
                rel = f"sys/fs/cgroup/cpuset/{path.strip('/')}/cpuset.effective_cpus"
            else:
                continue
            value = self._read(rel.replace("//", "/"))
            if value and value.strip():
                return parse_cpulist(value)
        return None


# --------------------------------------------------------------------------- GPU -> PCI


def _cuda_index(device: str) -> int | None:
    """The CUDA ordinal a runner.device names; None for the CPU (auto: a GPU if one is visible)."""
    if device == "cpu":
        return None
    if device == "auto":
        # Cheap probe before importing torch: no NVIDIA device nodes, no GPU.
        return 0 if os.path.exists("/dev/nvidiactl") else None
    _, _, idx = device.partition(":")
    return int(idx) if idx else 0


def _bdf_from_torch(index: int) -> str | None:
    import torch  # only for a CUDA device: planning for the CPU (systemd-unit) stays light

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(index)
    dom = getattr(props, "pci_domain_id", None)
    bus = getattr(props, "pci_bus_id", None)
    dev = getattr(props, "pci_device_id", None)
    if bus is None or dev is None:
        return None
    return f"{dom or 0:04x}:{bus:02x}:{dev:02x}.0"


def _bdf_from_nvidia_smi(index: int) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    # nvidia-smi counts in PCI order and ignores CUDA_VISIBLE_DEVICES; map through it.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    target: str = str(index)
    if visible:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        if index >= len(entries):
            return None
        target = entries[index]
    try:
        r = subprocess.run([exe, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in r.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and (parts[0] == target or parts[1].startswith(target)):
            dom, _, rest = parts[2].partition(":")  # "00000000:19:00.0" -> "0000:19:00.0"
            return f"{int(dom, 16):04x}:{rest}".lower()
    return None


def gpu_pci_address(device: str, *, use_torch: bool = True) -> tuple[str | None, str]:
    """(PCI address "dddd:bb:dd.f" of the CUDA device or None, how it was found or why not)."""
    index = _cuda_index(device)
    if index is None:
        return None, f"device {device}: no GPU"
    lookups = [("torch", _bdf_from_torch)] if use_torch else []
    lookups.append(("nvidia-smi", _bdf_from_nvidia_smi))
    failures = []
    for name, lookup in lookups:
        try:
            bdf = lookup(index)
        except Exception as e:  # noqa: BLE001 - a broken CUDA install must not stop placement
            failures.append(f"{name}: {type(e).__name__}: {e}".splitlines()[0])
            continue
        if bdf:
            return bdf, f"cuda:{index} at {bdf} (via {name})"
        failures.append(f"{name}: not found")
    return None, f"cuda:{index}: PCI address unknown ({'; '.join(failures)})"


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Step:
    """One placement decision: what, its outcome and why (one line)."""

    name: str
    outcome: Outcome
    detail: str

    def line(self) -> str:
        return f"  {self.name:<12} {self.outcome:<8} {self.detail}"


@dataclass(frozen=True)
class PlacementPlan:
    mode: Literal["none", "explicit", "auto"]
    hot_cores: tuple[int, ...]
    """Where the hot thread goes; () = leave it where it is."""
    helper_cores: tuple[int, ...]
    """Where every other thread (libzmq IO, CUDA, ZAP) and the control process go; () = leave."""
    device: str
    gpu_pci: str | None
    numa_node: int | None
    """The node the hot cores are on (auto: the GPU's node when known)."""
    isolated: tuple[int, ...]
    rt_priority: int
    mlockall: bool
    gc_freeze: bool
    steps: tuple[Step, ...] = ()
    """Planning outcomes: how the cores were chosen, and refused requests (no such core)."""
    warnings: tuple[str, ...] = ()

    @property
    def hot_isolated(self) -> bool:
        return bool(self.hot_cores) and set(self.hot_cores) <= set(self.isolated)


def _node_of(core: int, nodes: dict[int, list[int]]) -> int | None:
    for node, cores in nodes.items():
        if core in cores:
            return node
    return None


def plan_placement(
    cpu_cfg,
    device: str,
    *,
    slot: int = 0,
    sysfs_root: str = "/",
    inherited: Iterable[int] | None = None,
    gpu_pci: str | None = None,
    use_torch: bool = True,
) -> PlacementPlan:
    """Decide placement without changing anything.

    cpu_cfg: config.CpuConfig. device: runner.device (auto, cpu, cuda, cuda:N).
    slot: which candidate core `auto` takes (the shard index, so that shards on
    one NUMA node take different isolated cores). inherited: the current
    affinity mask (default: this thread's). gpu_pci: skip the GPU lookup.
    """
    fs = SysFs(sysfs_root)
    steps: list[Step] = []
    warnings: list[str] = []
    online = fs.online()
    cpuset = fs.cpuset()
    available = sorted(set(online) & set(cpuset)) if cpuset else online
    inherited_set = set(os.sched_getaffinity(0) if inherited is None else inherited) & set(available)
    isolated = [c for c in fs.isolated() if c in available]
    nodes = fs.nodes()
    cores_cfg = cpu_cfg.cores
    mode: Literal["none", "explicit", "auto"] = (
        "none" if cores_cfg == "none" else "auto" if cores_cfg == "auto" else "explicit")

    gpu_node: int | None = None
    if mode == "none":
        gpu_pci = None  # not looked up: nothing to place
    elif gpu_pci or _cuda_index(device) is not None:
        how = f"given {gpu_pci}" if gpu_pci else ""
        if gpu_pci is None:
            gpu_pci, how = gpu_pci_address(device, use_torch=use_torch)
        if gpu_pci is not None:
            gpu_node = fs.pci_numa_node(gpu_pci)
            steps.append(Step("gpu", "planned", f"{how}; NUMA node "
                              f"{gpu_node if gpu_node is not None else 'unknown (single node or no sysfs entry)'}"))
        else:
            steps.append(Step("gpu", "skipped", how))

    hot: list[int] = []
    node: int | None = None
    if mode == "explicit":
        for core in cores_cfg:
            if core not in online:
                steps.append(Step("core", "refused",
                                  f"core {core} does not exist or is offline (online: {format_cpulist(online)})"))
            elif core not in available:
                steps.append(Step("core", "refused",
                                  f"core {core} is outside this cgroup's cpuset ({format_cpulist(available)})"))
            else:
                hot.append(core)
        outside = [c for c in hot if c not in inherited_set]
        if outside:
            steps.append(Step("core", "planned",
                              f"core(s) {format_cpulist(outside)} outside the inherited mask "
                              f"{format_cpulist(inherited_set)} (taskset/CPUAffinity=/isolcpus); pinning anyway"))
        if len(hot) > 1:
            warnings.append(f"the hot thread may migrate among cores {format_cpulist(hot)}: "
                            "one core per process (shard) is the usual choice")
        node_set = {_node_of(c, nodes) for c in hot} - {None}
        if len(node_set) > 1:
            warnings.append(f"hot cores {format_cpulist(hot)} span NUMA nodes {sorted(node_set)}")
        node = next(iter(node_set)) if len(node_set) == 1 else None
        if gpu_node is not None and node is not None and node != gpu_node:
            warnings.append(f"hot core(s) on NUMA node {node} but the GPU is on node {gpu_node}: "
                            "every H2D/D2H copy crosses the socket interconnect")
        if hot:
            steps.append(Step("cores", "planned", f"explicit list: {format_cpulist(hot)}"))
    elif mode == "auto":
        node = gpu_node
        node_cores = [c for c in nodes.get(node, []) if c in available] if node is not None else []
        where = f"NUMA node {node}" if node is not None else "any node (GPU node unknown)"
        candidates: list[int]
        if node is not None and node_cores:
            candidates = [c for c in isolated if c in node_cores]
            why = f"isolated cores on {where}"
            if not candidates:
                # core 0 takes most IRQs and kernel housekeeping: highest cores first
                candidates = sorted((c for c in node_cores if c not in isolated), reverse=True)
                why = f"no isolated core on {where}; its cores, highest first"
        else:
            candidates = list(isolated)
            why = "isolated cores (GPU NUMA node unknown)"
            if not candidates:
                candidates = sorted(inherited_set or available, reverse=True)
                why = "no isolated cores; allowed cores, highest first"
        if candidates:
            pick = candidates[slot % len(candidates)]
            if slot >= len(candidates):
                warnings.append(f"slot {slot} but only {len(candidates)} candidate core(s) "
                                f"({format_cpulist(candidates)}): shares core {pick} with another shard")
            hot = [pick]
            node = _node_of(pick, nodes) if node is None else node
            steps.append(Step("cores", "planned",
                              f"auto: {why}: {format_cpulist(candidates)}; slot {slot} -> core {pick}"))
        else:
            steps.append(Step("cores", "refused", f"auto: no usable core on {where}"))
        if not isolated:
            warnings.append("no isolated cores (isolcpus=/nohz_full= on the kernel command line): "
                            "the hot core also runs other tasks and kernel work")

    helpers: list[int] = []
    if hot:
        hot_set = set(hot)
        node_cores_all = set(nodes.get(node, [])) if node is not None else set()
        tiers = [
            # same node first: the IO thread copies the messages the hot thread reads
            (inherited_set & node_cores_all) - hot_set - set(isolated),
            inherited_set - hot_set - set(isolated),
            inherited_set - hot_set,
            set(available) - hot_set - set(isolated),
        ]
        helpers = sorted(next((t for t in tiers if t), set()))
        if not helpers:
            warnings.append("no core left for helper threads: libzmq IO threads share the hot core, "
                            "which busy polling starves")
    if cpu_cfg.rt_priority > 0 and hot and not set(hot) <= set(isolated):
        warnings.append(f"SCHED_FIFO {cpu_cfg.rt_priority} on a non-isolated core: a spinning FIFO thread "
                        "starves that core's kernel threads (RT throttling leaves them 5%)")
    if cpu_cfg.rt_priority > 0 and not hot:
        warnings.append("SCHED_FIFO without pinning: the spinning thread may take any core")

    return PlacementPlan(
        mode=mode, hot_cores=tuple(hot), helper_cores=tuple(helpers), device=device,
        gpu_pci=gpu_pci, numa_node=node, isolated=tuple(isolated),
        rt_priority=cpu_cfg.rt_priority, mlockall=cpu_cfg.mlockall,
        gc_freeze=getattr(cpu_cfg, "gc_freeze", True), steps=tuple(steps), warnings=tuple(warnings))


# --------------------------------------------------------------------------- report


@dataclass
class PlacementReport:
    """What was applied and refused; logged once at start and exposed on /metrics."""

    plan: PlacementPlan
    steps: list[Step] = field(default_factory=list)
    hot_tid: int | None = None

    def add(self, step: Step) -> Step:
        self.steps.append(step)
        return step

    @property
    def refusals(self) -> list[Step]:
        return [s for s in self.steps if s.outcome == "refused"]

    def outcome(self, name: str) -> str:
        """The last outcome recorded under `name`, or "off"."""
        for s in reversed(self.steps):
            if s.name == name:
                return s.outcome
        return "off"

    def log_block(self) -> str:
        p = self.plan
        head = (f"placement: mode={p.mode} device={p.device} gpu={p.gpu_pci or '-'} "
                f"numa_node={p.numa_node if p.numa_node is not None else '-'} "
                f"hot={format_cpulist(p.hot_cores) or '-'} helpers={format_cpulist(p.helper_cores) or '-'} "
                f"isolated={format_cpulist(p.isolated) or '-'} refused={len(self.refusals)}")
        lines = [head, *(s.line() for s in self.steps)]
        lines += [f"  warning: {w}" for w in p.warnings]
        return "\n".join(lines)

    def as_labels(self) -> dict[str, str]:
        """Labels of one `hft_infer_placement_info` series (value 1)."""
        p = self.plan
        labels = {
            "mode": p.mode,
            "hot_cores": format_cpulist(p.hot_cores),
            "helper_cores": format_cpulist(p.helper_cores),
            "numa_node": "" if p.numa_node is None else str(p.numa_node),
            "gpu_pci": p.gpu_pci or "",
            "hot_isolated": "true" if p.hot_isolated else "false",
            "refused": str(len(self.refusals)),
            "warnings": str(len(p.warnings)),
        }
        for name in ("pin", "threads", "zmq_io", "rt_priority", "mlockall", "gc_freeze"):
            labels[name] = self.outcome(name)
        return labels


def _raise_if_strict(report: PlacementReport, strict: bool) -> None:
    if strict and report.refusals:
        first = report.refusals[0]
        more = f" (+{len(report.refusals) - 1} more)" if len(report.refusals) > 1 else ""
        err = ConfigError(f"cpu.strict: placement refused: {first.name}: {first.detail}{more}")
        err.report = report  # type: ignore[attr-defined]  # so the caller can still log the block
        raise err


# --------------------------------------------------------------------------- apply


def _oserror(e: OSError) -> str:
    return f"{errno.errorcode.get(e.errno or 0, e.errno)}: {e.strerror}"


def _thread_name(pid: int | str, tid: int | str) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _move_threads(pid: int, cores: tuple[int, ...], skip_tid: int | None) -> tuple[list[str], list[str]]:
    """Set the affinity of every thread of `pid` except skip_tid; (moved names, failures)."""
    moved, failed = [], []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError as e:
        return moved, [f"/proc/{pid}/task: {e.strerror}"]
    for tid in tids:
        if skip_tid is not None and int(tid) == skip_tid:
            continue
        name = _thread_name(pid, tid)
        try:
            os.sched_setaffinity(int(tid), cores)
            moved.append(name)
        except ProcessLookupError:
            continue  # exited meanwhile
        except OSError as e:
            failed.append(f"{name}: {_oserror(e)}")
    return moved, failed


def confine_threads(plan: PlacementPlan) -> Step:
    """Move every thread of this process but the calling one onto the helper cores."""
    if not plan.helper_cores:
        return Step("threads", "skipped", "no helper cores planned")
    moved, failed = _move_threads(os.getpid(), plan.helper_cores, threading.get_native_id())
    names = ", ".join(sorted(set(moved))) or "none"
    if failed:
        return Step("threads", "refused", f"could not move: {'; '.join(failed)}")
    return Step("threads", "applied",
                f"{len(moved)} other thread(s) on cores {format_cpulist(plan.helper_cores)} ({names})")


def confine_process(pid: int, plan: PlacementPlan) -> Step:
    """Move all threads of another process (the control process) onto the helper cores."""
    if not plan.helper_cores:
        return Step("control", "skipped", "no helper cores planned")
    moved, failed = _move_threads(pid, plan.helper_cores, None)
    if failed:
        return Step("control", "refused", f"pid {pid}: {'; '.join(failed)}")
    return Step("control", "applied",
                f"pid {pid}: {len(moved)} thread(s) on cores {format_cpulist(plan.helper_cores)}")


def zmq_io_affinity(plan: PlacementPlan) -> list[int]:
    """Cores for libzmq's IO and reaper threads: pass each to
    ctx.set(zmq.THREAD_AFFINITY_CPU_ADD, core) before the context's first socket."""
    return list(plan.helper_cores)


def configure_zmq_context(ctx, plan: PlacementPlan) -> Step:
    """Keep a context's IO threads off the hot core. Call before its first socket.

    libzmq applies the mask when it starts its threads (first socket) and
    aborts the whole process (posix_assert in thread.cpp) if
    pthread_setaffinity_np fails, e.g. for a core outside the cpuset; so every
    core is checked against this process's current cpuset first.
    """
    cores = zmq_io_affinity(plan)
    if not cores:
        return Step("zmq_io", "skipped", "no helper cores planned")
    usable = set(SysFs().cpuset() or SysFs().online())
    bad = [c for c in cores if c not in usable]
    if bad:
        return Step("zmq_io", "refused", f"core(s) {format_cpulist(bad)} not usable here; libzmq would abort")
    for core in cores:
        ctx.set(zmq.THREAD_AFFINITY_CPU_ADD, core)
    return Step("zmq_io", "applied", f"libzmq IO threads on cores {format_cpulist(cores)} "
                                     "(THREAD_AFFINITY_CPU_ADD, from the first socket on)")


_MCL_CURRENT, _MCL_FUTURE, _MCL_ONFAULT = 1, 2, 4


def _vm_locked_kib() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmLck:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def lock_memory() -> Step:
    """mlockall: no page of the process is ever swapped out or reclaimed.

    MCL_ONFAULT (Linux 4.4+) locks pages as they are touched instead of
    populating every mapping now: CUDA and glibc reserve large virtual ranges
    that would otherwise be committed (gigabytes). Everything the loop uses is
    touched during warm-up, so it is resident and locked before READY.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as e:
        return Step("mlockall", "refused", f"libc: {e}")
    flags = _MCL_CURRENT | _MCL_FUTURE | _MCL_ONFAULT
    rc = libc.mlockall(flags)
    err = ctypes.get_errno()
    if rc != 0 and err == errno.EINVAL:  # kernel without MCL_ONFAULT
        flags = _MCL_CURRENT | _MCL_FUTURE
        rc = libc.mlockall(flags)
        err = ctypes.get_errno()
    if rc != 0:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"
        return Step("mlockall", "refused", f"{errno.errorcode.get(err, err)}: {os.strerror(err)} "
                                           f"(RLIMIT_MEMLOCK {limit}; needs LimitMEMLOCK=infinity or CAP_IPC_LOCK)")
    onfault = "|MCL_ONFAULT" if flags & _MCL_ONFAULT else ""
    return Step("mlockall", "applied", f"MCL_CURRENT|MCL_FUTURE{onfault} (VmLck {_vm_locked_kib()} KiB)")


def set_rt_priority(priority: int) -> Step:
    """SCHED_FIFO for the calling thread only (the unit must not set CPUSchedulingPolicy:
    that would make every thread real-time)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as e:
        soft, _ = resource.getrlimit(resource.RLIMIT_RTPRIO)
        return Step("rt_priority", "refused",
                    f"SCHED_FIFO {priority}: {_oserror(e)} (RLIMIT_RTPRIO {soft}; needs LimitRTPRIO>={priority} "
                    "or CAP_SYS_NICE, and no RT group limit on the cgroup)")
    return Step("rt_priority", "applied", f"SCHED_FIFO priority {priority} (hot thread only)")


def apply_placement(plan: PlacementPlan, *, strict: bool, steps: Iterable[Step] = ()) -> PlacementReport:
    """Pin the calling (hot) thread, move the others, SCHED_FIFO, mlockall.

    Every step is recorded; a refusal is a warning in the report unless
    `strict`, which raises ConfigError (one line, the first refusal) after all
    steps were tried. `steps`: earlier outcomes to include (configure_zmq_context).
    """
    report = PlacementReport(plan, steps=list(plan.steps) + list(steps),
                             hot_tid=threading.get_native_id())
    if plan.hot_cores:
        where = f"core(s) {format_cpulist(plan.hot_cores)}"
        if plan.hot_isolated:
            where += " (isolated)"
        if plan.numa_node is not None:
            where += f", NUMA node {plan.numa_node}"
        try:
            os.sched_setaffinity(0, plan.hot_cores)
            report.add(Step("pin", "applied", f"hot thread {report.hot_tid} on {where}"))
        except OSError as e:
            report.add(Step("pin", "refused", f"hot thread on {where}: {_oserror(e)}"))
        if report.outcome("pin") == "applied":
            report.add(confine_threads(plan))
    elif plan.mode != "none":
        report.add(Step("pin", "refused", "no usable core: the hot thread stays unpinned"))
    if plan.rt_priority > 0:
        report.add(set_rt_priority(plan.rt_priority))
    if plan.mlockall:
        report.add(lock_memory())
    _raise_if_strict(report, strict)
    return report


def freeze_gc() -> Step:
    """Collect once, move every live object to the permanent generation and turn
    automatic collection off: no collector pause in the loop; housekeeping may
    call gc.collect(0) for cycles made after start."""
    gc.collect()
    gc.freeze()
    gc.disable()
    return Step("gc_freeze", "applied", f"gc.freeze(): {gc.get_freeze_count()} objects frozen; "
                                        "automatic collection off")


def finish_warmup(report: PlacementReport, *, strict: bool) -> PlacementReport:
    """After warm-up/capture: move threads born meanwhile (they inherited the hot
    core) onto the helper cores, then freeze the GC."""
    if report.outcome("pin") == "applied":
        if threading.get_native_id() != report.hot_tid:
            # confine_threads spares only the calling thread: from here it would move the hot one
            report.add(Step("threads", "refused", "finish_warmup must run on the hot thread"))
        else:
            step = confine_threads(report.plan)
            report.add(Step(step.name, step.outcome, "after warm-up: " + step.detail))
    if report.plan.gc_freeze:
        report.add(freeze_gc())
    _raise_if_strict(report, strict)
    return report


def current_placement() -> dict[str, str]:
    """This thread's affinity and policy as the kernel sees them (for checks and tests)."""
    policy = os.sched_getscheduler(0)
    names = {os.SCHED_OTHER: "other", os.SCHED_FIFO: "fifo", os.SCHED_RR: "rr"}
    return {
        "affinity": format_cpulist(os.sched_getaffinity(0)),
        "policy": names.get(policy, str(policy)),
        "priority": str(os.sched_getparam(0).sched_priority),
        "vm_locked_kib": str(_vm_locked_kib()),
    }


if __name__ == "__main__":  # `python -m hft_infer.affinity [cores|auto|none] [device]`: print a plan
    from types import SimpleNamespace

    arg = sys.argv[1] if len(sys.argv) > 1 else "auto"
    cores = arg if arg in ("auto", "none") else parse_cpulist(arg)
    cfg = SimpleNamespace(cores=cores, strict=False, rt_priority=0, mlockall=False, gc_freeze=True)
    plan = plan_placement(cfg, sys.argv[2] if len(sys.argv) > 2 else "auto")
    print(PlacementReport(plan, steps=list(plan.steps)).log_block())
