"""Where the hot thread and everything else go: a pure decision, no system call.

`plan_placement` reads the host (`topology`) and the `[cpu]` config and
returns a `PlacementPlan`: the hot core(s), the helper cores for every other
thread (libzmq IO, CUDA, ZAP, the control process), the GPU's NUMA node, and
one `Step` per decision with its reason. `pinning.apply_placement` carries
it out; `systemd-unit` uses the same plan for `CPUAffinity=`/`NUMAMask=`.

Why helper cores at all: threads inherit the affinity of the thread that
creates them, so every helper started after the hot thread is pinned would
share its core, and a busy-polling thread starves a libzmq IO thread that
shares its core (p99.9 of 4 ms measured on the H200 host, see DESIGN.md).
The same holds for another shard's hot core: under `auto`, shard I takes the
I-th candidate core, so every shard can tell the others' hot cores and keeps
its helpers off them (before 2026-12-05 it kept off its own only, and 12
shards on the H200 host let their IO threads onto each other's spinning
cores). Candidates come one per physical core before any SMT sibling: two
spinning loops on one core's two threads share its execution units.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from hft_infer.topology import SysFs, cuda_index, format_cpulist, gpu_pci_address

Outcome = Literal["applied", "refused", "skipped", "planned"]


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


def _physical_cores_first(candidates: list[int], siblings: dict[int, frozenset[int]]) -> list[int]:
    """`candidates` reordered so that no core comes before every physical core has one taken:
    in order, each core whose SMT siblings are all still untaken; then the rest, in order.
    Two busy-polling loops on the two threads of one physical core share its execution units.
    Unchanged on a host without SMT."""
    first: list[int] = []
    taken: set[int] = set()
    for c in candidates:
        if not siblings.get(c, frozenset((c,))) & taken:
            first.append(c)
            taken.add(c)
    return first + [c for c in candidates if c not in taken]


# shards on one host from which one helper core for all of them is warned of: a handful share one
# core's I/O threads at low rates, but 12 lstm_a shards at ~1M events/s saturated it (wave 27)
MANY_SHARDS = 4


def plan_placement(
    cpu_cfg,
    device: str,
    *,
    slot: int = 0,
    shards: int = 1,
    sysfs_root: str = "/",
    inherited: Iterable[int] | None = None,
    gpu_pci: str | None = None,
    use_torch: bool = True,
) -> PlacementPlan:
    """Decide placement without changing anything.

    cpu_cfg: config.CpuConfig. device: runner.device (auto, cpu, cuda, cuda:N).
    slot: which candidate core `auto` takes (the shard index, so that shards on
    one NUMA node take different isolated cores). shards: how many shards take
    `auto` slots on this host (universe.shard_count): the hot cores of slots
    0..shards-1 are kept free of this shard's helper threads too, so that no
    libzmq IO thread lands on another shard's busy-polling core. inherited: the current
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
    elif gpu_pci or cuda_index(device) is not None:
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
    reserved: set[int] = set()  # every shard's hot core (auto): no helper thread goes there
    siblings: dict[int, frozenset[int]] = {}
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
            siblings = fs.siblings(candidates)
            spread = _physical_cores_first(candidates, siblings)
            listed = format_cpulist(candidates)
            if spread != candidates:
                why += ", one per physical core first (SMT)"
                candidates, listed = spread, ",".join(map(str, spread))
            pick = candidates[slot % len(candidates)]
            if slot >= len(candidates):
                warnings.append(f"slot {slot} but only {len(candidates)} candidate core(s) "
                                f"({format_cpulist(candidates)}): shares core {pick} with another shard")
            else:
                shared = [(s, c) for s, c in enumerate(candidates[:slot]) if c in siblings.get(pick, ())]
                if shared:
                    warnings.append(f"slot {slot}'s core {pick} is an SMT sibling of slot {shared[0][0]}'s core "
                                    f"{shared[0][1]}: two busy-polling loops share one physical core")
            hot = [pick]
            reserved = {candidates[i % len(candidates)] for i in range(max(shards, slot + 1))}
            node = _node_of(pick, nodes) if node is None else node
            kept = f" (shards' cores {format_cpulist(reserved)} kept free of helpers)" if len(reserved) > 1 else ""
            steps.append(Step("cores", "planned", f"auto: {why}: {listed}; slot {slot} -> core {pick}{kept}"))
        else:
            steps.append(Step("cores", "refused", f"auto: no usable core on {where}"))
        if not isolated:
            warnings.append("no isolated cores (isolcpus=/nohz_full= on the kernel command line): "
                            "the hot core also runs other tasks and kernel work")

    helpers: list[int] = []
    if hot:
        node_cores_all = set(nodes.get(node, [])) if node is not None else set()
        iso = set(isolated)
        # every shard's hot core (auto; explicit: this one's) and the SMT siblings of those stay
        # free of helper threads while any other core is left; isolated cores (kept for hot
        # threads) only after that; another shard's hot core only on a host with no core left
        busy = set(hot) | reserved
        busy_smt = busy.union(*(siblings.get(c, ()) for c in busy))
        same_node = inherited_set & node_cores_all  # first: the IO thread copies what the hot thread reads
        tiers = [
            same_node - busy_smt - iso,
            inherited_set - busy_smt - iso,
            same_node - busy - iso,
            inherited_set - busy - iso,
            inherited_set - busy,
            inherited_set - set(hot) - iso,
            inherited_set - set(hot),
            set(available) - set(hot) - iso,
        ]
        helpers = sorted(next((t for t in tiers if t), set()))
        if not helpers:
            warnings.append("no core left for helper threads: libzmq IO threads share the hot core, "
                            "which busy polling starves")
        elif set(helpers) & (busy - set(hot)):
            warnings.append(f"no core left for helper threads beside the {len(busy)} shards' hot cores "
                            f"({format_cpulist(busy)}): libzmq IO threads share other shards' busy-polling cores")
        elif len(helpers) == 1 and len(reserved) >= MANY_SHARDS:
            warnings.append(f"the {len(reserved)} shards on this host leave one core ({helpers[0]}) for every "
                            "helper thread (all their libzmq IO threads, CUDA's): near 1M events/s across them "
                            "one core saturates and the feed arrives late (12 lstm_a shards did, BENCHMARKS.md "
                            "wave 27); leave two or more (fewer shards, or cpu.cores)")
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


def host_slot(cpu_cfg, shard_index: int, shard_count: int) -> tuple[int, int]:
    """This shard's `auto` slot and how many shards share the host: its place among
    cpu.host_shards and their number (empty: every shard of shard_count runs here, slot = index).
    A shard alone on its host (host_shards = [I]) takes the host's first candidate core and keeps
    no other slot's core free."""
    host = list(cpu_cfg.host_shards) or list(range(shard_count))
    if shard_index not in host:  # Config validates this; a caller with its own --shard may not have
        raise ValueError(f"shard {shard_index} is not among cpu.host_shards {host}")
    return host.index(shard_index), len(host)


def plan_for_config(cfg, device: str, **kwargs) -> PlacementPlan:
    """`plan_placement` for a service's config: its `[cpu]`, and its shard (universe.shard_index of
    universe.shard_count) as the slot among the shards on this host (host_slot). `kwargs`:
    plan_placement's."""
    slot, shards = host_slot(cfg.cpu, cfg.universe.shard_index, cfg.universe.shard_count)
    return plan_placement(cfg.cpu, device, slot=slot, shards=shards, **kwargs)


__all__ = ["Outcome", "PlacementPlan", "Step", "host_slot", "plan_for_config", "plan_placement"]
