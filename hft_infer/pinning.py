"""Carry out a placement plan: the system calls, each recorded as applied or refused.

Order of calls in the service (why each one is where it is):

    plan = plan_for_config(cfg, cfg.runner.device)   # plan_placement with the config's shard
    ctx = zmq.Context()
    zmq_step = configure_zmq_context(ctx, plan)     # before the first socket: IO threads
                                                    # start then and keep their mask
    report = apply_placement(plan, strict=cfg.cpu.strict, steps=[zmq_step])
                                                    # before allocating: first-touch pages
                                                    # land on the hot core's NUMA node
    ... allocate, warm up, capture graphs ...
    finish_warmup(report, strict=cfg.cpu.strict)    # move threads born during warm-up
                                                    # (CUDA, Triton) off the hot core;
                                                    # freeze the GC (heap.FrozenHeap)
    log.info(report.log_block()); notifier.ready()

A refusal (no permission, no such core) is a warning in the report unless
`strict`, which raises ConfigError after every step was tried. Nothing here
is imported on the hot path.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import threading
from collections.abc import Iterable

import zmq

from hft_infer.heap import FrozenHeap
from hft_infer.placement import PlacementPlan, Step
from hft_infer.placement_report import PlacementReport, raise_if_strict
from hft_infer.topology import SysFs, format_cpulist


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
    raise_if_strict(report, strict)
    return report


def freeze_gc(heap: FrozenHeap | None = None) -> Step:
    """Collect once, freeze the heap, automatic collection off (`heap.FrozenHeap`): no
    collector pause in the loop; its housekeeping calls `heap.collect_young()`.

    `heap`: the loop's own FrozenHeap, so that one object owns the freeze and
    restores it when the loop ends; without one the heap stays frozen for the
    life of the process."""
    heap = heap if heap is not None else FrozenHeap()
    frozen = heap.freeze()
    return Step("gc_freeze", "applied", f"gc.freeze(): {frozen} objects frozen; automatic collection off")


def finish_warmup(report: PlacementReport, *, strict: bool, heap: FrozenHeap | None = None) -> PlacementReport:
    """After warm-up/capture: move threads born meanwhile (they inherited the hot
    core) onto the helper cores, then freeze the GC (`freeze_gc(heap)`) if the plan says so."""
    if report.outcome("pin") == "applied":
        if threading.get_native_id() != report.hot_tid:
            # confine_threads spares only the calling thread: from here it would move the hot one
            report.add(Step("threads", "refused", "finish_warmup must run on the hot thread"))
        else:
            step = confine_threads(report.plan)
            report.add(Step(step.name, step.outcome, "after warm-up: " + step.detail))
    if report.plan.gc_freeze:
        report.add(freeze_gc(heap))
    raise_if_strict(report, strict)
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


__all__ = ["apply_placement", "configure_zmq_context", "confine_process", "confine_threads", "current_placement",
           "finish_warmup", "freeze_gc", "lock_memory", "set_rt_priority", "zmq_io_affinity"]
