"""CPU placement of the hot thread, in one import: cores, real-time priority, locked memory, frozen GC.

The pieces, one job each:

- `topology`: the host as sysfs describes it (cpulists, online and isolated
  cores, NUMA nodes, the cgroup's cpuset) and a GPU's PCI address;
- `placement`: `plan_placement`, a pure decision of where the hot thread and
  everything else go (`PlacementPlan`, one `Step` per decision);
- `pinning`: the system calls that carry a plan out (`apply_placement`,
  `configure_zmq_context`, `finish_warmup`), each recorded as applied or refused;
- `placement_report`: `PlacementReport`, the start-up block and `/metrics` labels;
- `heap`: the frozen GC (`FrozenHeap`) that `finish_warmup` turns on.

This module re-exports their public names (the service, `systemd-unit` and
the tests import them from here) and previews a plan for this host without
changing anything:

    python -m hft_infer.affinity [CORES|auto|none] [DEVICE] [I/N]   # e.g. auto cuda:0 3/8 (shard 3 of 8)
"""

from __future__ import annotations

import re
import sys
from types import SimpleNamespace

from hft_infer.pinning import (
    apply_placement,
    configure_zmq_context,
    confine_process,
    confine_threads,
    current_placement,
    finish_warmup,
    freeze_gc,
    lock_memory,
    set_rt_priority,
    zmq_io_affinity,
)
from hft_infer.placement import Outcome, PlacementPlan, Step, plan_for_config, plan_placement
from hft_infer.placement_report import PlacementReport
from hft_infer.topology import SysFs, format_cpulist, gpu_pci_address, parse_cpulist

__all__ = [
    "Outcome", "PlacementPlan", "PlacementReport", "Step", "SysFs", "apply_placement", "configure_zmq_context",
    "confine_process", "confine_threads", "current_placement", "finish_warmup", "format_cpulist", "freeze_gc",
    "gpu_pci_address", "lock_memory", "parse_cpulist", "plan_for_config", "plan_placement", "set_rt_priority",
    "zmq_io_affinity",
]


def main(argv: list[str] | None = None) -> int:
    """Print the plan `cpu.cores = CORES` and `runner.device = DEVICE` would get on this host."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 3 or any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    arg = argv[0] if argv else "auto"
    try:
        cores = arg if arg in ("auto", "none") else parse_cpulist(arg)
    except ValueError as e:
        print(f"error: cores: {e} (a cpulist such as 3 or 2-5, auto or none)", file=sys.stderr)
        return 2
    cfg = SimpleNamespace(cores=cores, strict=False, rt_priority=0, mlockall=False, gc_freeze=True)
    device = argv[1] if len(argv) > 1 else "auto"
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        print(f"error: device {device!r}: expected auto, cpu, cuda or cuda:N", file=sys.stderr)
        return 2
    slot, shards = 0, 1
    if len(argv) > 2:
        m = re.fullmatch(r"(\d+)/(\d+)", argv[2])
        if m is None or not int(m.group(1)) < int(m.group(2)):
            print(f"error: shard {argv[2]!r}: expected I/N with 0 <= I < N", file=sys.stderr)
            return 2
        slot, shards = int(m.group(1)), int(m.group(2))
    plan = plan_placement(cfg, device, slot=slot, shards=shards)
    print(PlacementReport(plan, steps=list(plan.steps)).log_block())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
