"""The host as placement sees it: cpulists, sysfs (online, isolated, NUMA nodes, cgroup cpuset), GPU PCI address.

Read-only: nothing here changes the system. `SysFs` reads under a root so
that tests can plan against fake trees. torch is imported only to find a
CUDA device's PCI address, and only when the device is CUDA.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable

_CPULIST_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")



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

    def siblings(self, cpus: Iterable[int]) -> dict[int, frozenset[int]]:
        """CPU -> the logical CPUs of its physical core (its SMT siblings, itself included); a CPU
        whose topology the kernel does not expose (or a corrupt file) counts as a core of its own."""
        out: dict[int, frozenset[int]] = {}
        for cpu in cpus:
            text = self._read(f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
            try:
                out[cpu] = frozenset(parse_cpulist(text)) | {cpu} if text else frozenset((cpu,))
            except ValueError:
                out[cpu] = frozenset((cpu,))
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


def cuda_index(device: str) -> int | None:
    """The CUDA ordinal a runner.device names; None for the CPU (auto: a GPU if one is visible)."""
    if device == "cpu":
        return None
    if device == "auto":
        # Cheap probe before importing torch: no NVIDIA device nodes, no GPU.
        return 0 if os.path.exists("/dev/nvidiactl") else None
    _, _, idx = device.partition(":")
    return int(idx) if idx else 0


def _bdf_from_torch(index: int) -> tuple[str | None, str]:
    """(PCI address, "") or (None, why torch cannot tell)."""
    try:
        import torch  # only for a CUDA device: planning for the CPU (systemd-unit) stays light
    except ImportError:
        return None, "not installed"
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        return None, f"{torch.__version__} ({build}) sees no CUDA device"
    count = torch.cuda.device_count()
    if index >= count:
        return None, f"sees {count} CUDA device(s), no cuda:{index}"
    props = torch.cuda.get_device_properties(index)
    dom = getattr(props, "pci_domain_id", None)
    bus = getattr(props, "pci_bus_id", None)
    dev = getattr(props, "pci_device_id", None)
    if bus is None or dev is None:
        return None, f"{torch.__version__} does not report PCI addresses"
    return f"{dom or 0:04x}:{bus:02x}:{dev:02x}.0", ""


def _bdf_from_nvidia_smi(index: int) -> tuple[str | None, str]:
    """(PCI address, "") or (None, why nvidia-smi cannot tell)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "not installed"
    # nvidia-smi counts in PCI order and ignores CUDA_VISIBLE_DEVICES; map through it.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    target: str = str(index)
    if visible:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        if index >= len(entries):
            return None, f"CUDA_VISIBLE_DEVICES={visible} has no entry {index}"
        target = entries[index]
    try:
        r = subprocess.run([exe, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"did not run: {e}"
    for line in r.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and (parts[0] == target or parts[1].startswith(target)):
            dom, _, rest = parts[2].partition(":")  # "00000000:19:00.0" -> "0000:19:00.0"
            return f"{int(dom, 16):04x}:{rest}".lower(), ""
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[:1]}"
    return None, f"lists no GPU {target}"


def gpu_pci_address(device: str, *, use_torch: bool = True) -> tuple[str | None, str]:
    """(PCI address "dddd:bb:dd.f" of the CUDA device or None, how it was found or why not)."""
    index = cuda_index(device)
    if index is None:
        return None, f"device {device}: no GPU"
    lookups = [("torch", _bdf_from_torch)] if use_torch else []
    lookups.append(("nvidia-smi", _bdf_from_nvidia_smi))
    failures = []
    for name, lookup in lookups:
        try:
            bdf, why = lookup(index)
        except Exception as e:  # noqa: BLE001 - a broken CUDA install must not stop placement
            failures.append(f"{name}: {type(e).__name__}: {e}".splitlines()[0])
            continue
        if bdf:
            return bdf, f"cuda:{index} at {bdf} (via {name})"
        failures.append(f"{name}: {why}")
    return None, f"cuda:{index}: PCI address unknown ({'; '.join(failures)})"


__all__ = ["SysFs", "cuda_index", "format_cpulist", "gpu_pci_address", "parse_cpulist"]
