"""What the process actually runs with: every placement step, applied or refused, in one record.

`PlacementReport` collects the plan's steps and those of `pinning`; it is
logged once at start (`log_block`) and exposed as the labels of one
`hft_infer_placement_info` series on `/metrics` (`as_labels`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hft_infer.errors import ConfigError
from hft_infer.placement import PlacementPlan, Step
from hft_infer.topology import format_cpulist


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


def raise_if_strict(report: PlacementReport, strict: bool) -> None:
    if strict and report.refusals:
        first = report.refusals[0]
        more = f" (+{len(report.refusals) - 1} more)" if len(report.refusals) > 1 else ""
        err = ConfigError(f"cpu.strict: placement refused: {first.name}: {first.detail}{more}")
        err.report = report  # type: ignore[attr-defined]  # so the caller can still log the block
        raise err


__all__ = ["PlacementReport", "raise_if_strict"]
