"""CPU placement: planning against fake sysfs trees, real pinning and refusals in subprocesses.

Anything that changes the scheduling state of a process (pinning, SCHED_FIFO,
mlockall, gc.freeze) runs in a child process, never in pytest itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hft_infer.affinity import (
    PlacementPlan,
    PlacementReport,
    Step,
    apply_placement,
    configure_zmq_context,
    confine_process,
    format_cpulist,
    parse_cpulist,
    plan_placement,
)
from hft_infer.config import ConfigError, CpuConfig

ALLOWED = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 usable cores")


def cpu(cores="auto", **kw):
    return CpuConfig(cores=cores, **kw)


def make_sysfs(root: Path, *, online="0-15", isolated="", nodes=None, pci=None, cgroup=None, siblings=None):
    """A fake /sys (and /proc/self/cgroup) with the files placement reads; `siblings`: cpu ->
    its thread_siblings_list text (SMT), for the cpus given."""
    nodes = {0: "0-7", 1: "8-15"} if nodes is None else nodes
    cpu_dir = root / "sys/devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(online + "\n")
    (cpu_dir / "isolated").write_text(isolated + "\n")
    for c, text in (siblings or {}).items():
        (cpu_dir / f"cpu{c}/topology").mkdir(parents=True)
        (cpu_dir / f"cpu{c}/topology/thread_siblings_list").write_text(text + "\n")
    for node, cpulist in nodes.items():
        d = root / f"sys/devices/system/node/node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    for bdf, node in (pci or {}).items():
        d = root / f"sys/bus/pci/devices/{bdf}"
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    if cgroup:
        line, rel, cpus = cgroup
        (root / "proc/self").mkdir(parents=True)
        (root / "proc/self/cgroup").write_text(line + "\n")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(cpus + "\n")
    return str(root)


GPU = "0000:19:00.0"


def plan(tmp_path, cores="auto", device="cuda:0", *, inherited=range(16), slot=0, gpu=GPU, cpu_kw=None, **fs):
    root = make_sysfs(tmp_path, **fs)
    return plan_placement(cpu(cores, **(cpu_kw or {})), device, slot=slot, sysfs_root=root,
                          inherited=inherited, gpu_pci=gpu)


# --------------------------------------------------------------------------- cpulists


@pytest.mark.parametrize("text,cores", [
    ("", []), ("\n", []), ("0", [0]), ("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]),
    ("8,0-1", [0, 1, 8]), ("0-7:2", [0, 2, 4, 6]), (" 3 , 5 ", [3, 5]),
])
def test_parse_cpulist(text, cores):
    assert parse_cpulist(text) == cores


@pytest.mark.parametrize("bad", ["a", "3-1", "1,,2", "0-", "-1", "0-3:0"])
def test_parse_cpulist_rejects_garbage(bad):
    with pytest.raises(ValueError):
        parse_cpulist(bad)


def test_format_cpulist_round_trips():
    for cores in ([], [0], [0, 1, 2, 3, 8, 10, 11], [5, 1, 3, 2]):
        assert parse_cpulist(format_cpulist(cores)) == sorted(cores)
    assert format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


# --------------------------------------------------------------------------- planning


def test_auto_takes_isolated_core_on_gpu_node(tmp_path):
    p = plan(tmp_path, isolated="6-7,14-15", pci={GPU: 1})
    assert p.numa_node == 1 and p.hot_cores == (14,) and p.hot_isolated
    # helpers: the GPU node's non-isolated cores, never the hot or another isolated core
    assert p.helper_cores == tuple(range(8, 14))
    assert any("isolated cores on NUMA node 1" in s.detail for s in p.steps)
    assert not [s for s in p.steps if s.outcome == "refused"]


def test_auto_slot_gives_shards_distinct_cores_and_warns_when_they_run_out(tmp_path):
    root = make_sysfs(tmp_path, isolated="14-15", pci={GPU: 1})
    picks = [plan_placement(cpu(), "cuda:0", slot=s, sysfs_root=root, inherited=range(16), gpu_pci=GPU)
             for s in range(3)]
    assert [p.hot_cores for p in picks] == [(14,), (15,), (14,)]
    assert not picks[1].warnings and any("shares core 14" in w for w in picks[2].warnings)


ONE_NODE = {0: "0-15"}


def test_auto_keeps_every_shards_hot_core_free_of_helper_threads(tmp_path):
    # before: shard 1 of 4 put its libzmq IO threads on cores 0-13, 15 -- three of them the other
    # shards' busy-polling cores (seen on the H200 host: 12 shards, IO threads on 0,4-5,7-15)
    root = make_sysfs(tmp_path, nodes=ONE_NODE, pci={GPU: 0})
    plans = [plan_placement(cpu(), "cuda:0", slot=s, shards=4, sysfs_root=root, inherited=range(16), gpu_pci=GPU)
             for s in range(4)]
    assert [p.hot_cores for p in plans] == [(15,), (14,), (13,), (12,)]
    assert all(p.helper_cores == tuple(range(12)) for p in plans)
    assert any("shards' cores 12-15 kept free of helpers" in s.detail for s in plans[1].steps)
    assert not any("busy-polling cores" in w for p in plans for w in p.warnings)
    alone = plan_placement(cpu(), "cuda:0", slot=0, sysfs_root=root, inherited=range(16), gpu_pci=GPU)
    assert alone.helper_cores == tuple(range(15))  # one shard: only its own core is kept free


def test_a_shard_alone_on_its_host_takes_the_first_core_and_reserves_no_other(tmp_path):
    """cpu.host_shards: shard 3 of 4 deployed alone on its host (host_shards = [3]) plans as slot 0
    of 1 (the host's first candidate core, every other core for helpers); shards 2 and 3 of 4 on one
    host as slots 0 and 1 of 2; empty = every shard on this host, as before. The config refuses a
    list that leaves out the shard's own index (or names one past shard_count)."""
    from hft_infer.config import load_config
    from hft_infer.placement import host_slot, plan_for_config

    root = make_sysfs(tmp_path, nodes=ONE_NODE, pci={GPU: 0})

    def cfg(index, host):
        return load_config(None, ['cpu.cores="auto"', f"universe.shard_index={index}", "universe.shard_count=4",
                                  f"cpu.host_shards={json.dumps(host)}"])

    def placed(c):
        return plan_for_config(c, "cuda:0", sysfs_root=root, inherited=range(16), gpu_pci=GPU)

    alone = placed(cfg(3, [3]))
    assert host_slot(cfg(3, [3]).cpu, 3, 4) == (0, 1)
    assert alone.hot_cores == (15,) and alone.helper_cores == tuple(range(15))
    pair = [placed(cfg(i, [2, 3])) for i in (2, 3)]
    assert [p.hot_cores for p in pair] == [(15,), (14,)]
    assert all(p.helper_cores == tuple(range(14)) for p in pair)
    every = placed(cfg(3, []))  # all four here: slot 3, slots 0-3's cores kept free
    assert every.hot_cores == (12,) and every.helper_cores == tuple(range(12))
    for bad in ([2], [3, 3], [3, 4]):
        with pytest.raises(ConfigError, match="cpu.host_shards"):
            cfg(3, bad)


def test_more_shards_than_cores_share_hot_cores_with_helpers_and_say_so(tmp_path):
    root = make_sysfs(tmp_path, online="0-3", nodes={0: "0-3"}, pci={GPU: 0})
    p = plan_placement(cpu(), "cuda:0", slot=0, shards=4, sysfs_root=root, inherited=range(4), gpu_pci=GPU)
    assert p.hot_cores == (3,) and p.helper_cores == (0, 1, 2)
    assert any("share other shards' busy-polling cores" in w for w in p.warnings)


def test_many_shards_with_one_helper_core_left_are_warned_of(tmp_path):
    root = make_sysfs(tmp_path, nodes=ONE_NODE, pci={GPU: 0})
    crowded = plan_placement(cpu(), "cuda:0", slot=0, shards=15, sysfs_root=root, inherited=range(16), gpu_pci=GPU)
    assert crowded.helper_cores == (0,)
    assert any("15 shards on this host leave one core (0) for every helper thread" in w for w in crowded.warnings)
    roomy = plan_placement(cpu(), "cuda:0", slot=0, shards=14, sysfs_root=root, inherited=range(16), gpu_pci=GPU)
    assert roomy.helper_cores == (0, 1) and not any("helper thread" in w for w in roomy.warnings)
    few = make_sysfs(tmp_path / "few", online="0-3", nodes={0: "0-3"}, pci={GPU: 0})  # 3 shards, one core left:
    small = plan_placement(cpu(), "cuda:0", slot=0, shards=3, sysfs_root=few, inherited=range(4), gpu_pci=GPU)
    assert small.helper_cores == (0,) and not any("helper thread" in w for w in small.warnings)  # too few to say


HALVES = {c: f"{c % 8},{c % 8 + 8}" for c in range(16)}  # 8 physical cores, threads c and c + 8
ADJACENT = {c: f"{c & ~1},{c | 1}" for c in range(16)}  # 8 physical cores, threads 2k and 2k + 1


def test_auto_puts_shards_on_distinct_physical_cores_first(tmp_path):
    root = make_sysfs(tmp_path / "adjacent", nodes=ONE_NODE, pci={GPU: 0}, siblings=ADJACENT)
    plans = [plan_placement(cpu(), "cuda:0", slot=s, shards=2, sysfs_root=root, inherited=range(16), gpu_pci=GPU)
             for s in range(9)]
    # highest first, one thread per physical core (15, 13, ..., 1), then their siblings (14, ...)
    assert [p.hot_cores[0] for p in plans] == [15, 13, 11, 9, 7, 5, 3, 1, 14]
    assert not any("SMT sibling" in w for p in plans[:8] for w in p.warnings)
    assert any("slot 8's core 14 is an SMT sibling of slot 0's core 15" in w for w in plans[8].warnings)
    assert any("one per physical core first (SMT): 15,13,11,9,7,5,3,1,14,12" in s.detail for s in plans[0].steps)
    # helpers: neither shard's hot core (15, 13) nor their siblings (14, 12)
    assert plans[0].helper_cores == tuple(range(12))
    # threads c and c + 8: highest first already spreads them (no reordering to report)
    root = make_sysfs(tmp_path / "halves", nodes=ONE_NODE, pci={GPU: 0}, siblings=HALVES)
    plans = [plan_placement(cpu(), "cuda:0", slot=s, shards=2, sysfs_root=root, inherited=range(16), gpu_pci=GPU)
             for s in (0, 7, 8)]
    assert [p.hot_cores[0] for p in plans] == [15, 8, 7]
    assert not any("one per physical core first" in s.detail for s in plans[0].steps)
    assert any("slot 8's core 7 is an SMT sibling of slot 0's core 15" in w for w in plans[2].warnings)
    assert plans[0].helper_cores == (0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13)


def test_unreadable_smt_topology_counts_each_cpu_as_its_own_core(tmp_path):
    root = make_sysfs(tmp_path, nodes=ONE_NODE, pci={GPU: 0}, siblings={15: "garbage", 14: "6,14"})
    plans = [plan_placement(cpu(), "cuda:0", slot=s, sysfs_root=root, inherited=range(16), gpu_pci=GPU)
             for s in range(3)]
    assert [p.hot_cores[0] for p in plans] == [15, 14, 13]


def test_auto_without_isolated_core_on_gpu_node_takes_its_highest_core(tmp_path):
    # isolated cores exist, but on the other node: stay on the GPU's node
    p = plan(tmp_path, isolated="6-7", pci={GPU: 1})
    assert p.hot_cores == (15,) and p.numa_node == 1 and not p.hot_isolated
    assert any("no isolated core on NUMA node 1" in s.detail for s in p.steps)


def test_auto_gpu_without_numa_info_uses_any_isolated_core(tmp_path):
    p = plan(tmp_path, isolated="3", pci={GPU: -1})  # -1: single-node hosts report this
    assert p.hot_cores == (3,) and p.numa_node == 0


def test_auto_on_cpu_without_isolated_cores_avoids_core_0(tmp_path):
    p = plan(tmp_path, device="cpu", online="0-3", nodes={0: "0-3"}, inherited=range(4), gpu=None)
    assert p.hot_cores == (3,) and p.helper_cores == (0, 1, 2)
    assert any("no isolated cores" in w for w in p.warnings)
    assert p.gpu_pci is None and not [s for s in p.steps if s.name == "gpu"]


def test_explicit_list_refuses_nonexistent_core_and_keeps_the_rest(tmp_path):
    p = plan(tmp_path, cores=[3, 99], pci={GPU: 1})
    refused = [s for s in p.steps if s.outcome == "refused"]
    assert p.hot_cores == (3,)
    assert len(refused) == 1 and "core 99 does not exist" in refused[0].detail
    # core 3 is on node 0, the GPU on node 1: said, not refused
    assert any("crosses the socket interconnect" in w for w in p.warnings)


def test_explicit_core_outside_cgroup_cpuset_is_refused(tmp_path):
    p = plan(tmp_path, cores=[2, 5], device="cpu", gpu=None,
             cgroup=("0::/svc.slice/x.service", "sys/fs/cgroup/svc.slice/x.service/cpuset.cpus.effective", "0-3"))
    assert p.hot_cores == (2,)
    assert any("core 5 is outside this cgroup's cpuset (0-3)" in s.detail for s in p.steps)


def test_cgroup_v1_cpuset_is_read(tmp_path):
    p = plan(tmp_path, cores=[6], device="cpu", gpu=None,
             cgroup=("3:cpuset:/docker/abc", "sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus", "4-7"))
    assert p.hot_cores == (6,) and p.helper_cores == (4, 5, 7)


def test_isolated_core_outside_inherited_mask_is_pinned_anyway(tmp_path):
    # isolcpus=: a shell's inherited mask excludes the isolated cores, yet pinning onto them works
    p = plan(tmp_path, cores=[15], device="cpu", gpu=None, isolated="15", inherited=range(15))
    assert p.hot_cores == (15,)
    assert any(s.outcome == "planned" and "outside the inherited mask" in s.detail for s in p.steps)
    assert 15 not in p.helper_cores and p.helper_cores == tuple(range(8, 15))


def test_none_plans_no_pinning(tmp_path):
    p = plan(tmp_path, cores="none")
    assert p.mode == "none" and p.hot_cores == () and p.helper_cores == () and p.gpu_pci is None


def test_rt_priority_on_shared_core_is_warned(tmp_path):
    p = plan(tmp_path, cores=[3], device="cpu", gpu=None, cpu_kw={"rt_priority": 10})
    assert any("SCHED_FIFO 10 on a non-isolated core" in w for w in p.warnings)


def test_single_core_host_warns_that_helpers_share_the_hot_core(tmp_path):
    p = plan(tmp_path, cores=[0], device="cpu", gpu=None, online="0", nodes={0: "0"}, inherited=[0])
    assert p.helper_cores == () and any("share the hot core" in w for w in p.warnings)


def test_planning_for_the_cpu_does_not_import_torch():
    code = ("import sys; from types import SimpleNamespace as N; from hft_infer.affinity import plan_placement;"
            "plan_placement(N(cores='auto', rt_priority=0, mlockall=False, gc_freeze=True), 'cpu');"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


# --------------------------------------------------------------------------- applying (real system calls)


def run_child(code: str, *, prefix=(), preexec_fn=None) -> dict:
    r = subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=120, preexec_fn=preexec_fn)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


CHILD_PIN = """
import json, os, threading, time
import zmq
from hft_infer.affinity import plan_placement, configure_zmq_context, apply_placement, finish_warmup
from hft_infer.config import CpuConfig

def masks():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        name = open(f"/proc/self/task/{tid}/comm").read().strip()
        status = open(f"/proc/self/task/{tid}/status").read()
        mask = [l.split()[1] for l in status.splitlines() if l.startswith("Cpus_allowed_list")][0]
        if int(tid) == threading.get_native_id():
            name = "HOT"
        elif int(tid) == late.native_id:
            name = "born-late"  # Python 3.11 does not name OS threads
        out[name] = mask
    return out

plan = plan_placement(CpuConfig(cores=[HOT]), "cpu")
ctx = zmq.Context()
zmq_step = configure_zmq_context(ctx, plan)
sock = ctx.socket(zmq.PUB)          # starts libzmq's IO and reaper threads
for _ in range(2000):               # which name themselves once they run
    names = [open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task")]
    if sum("ZMQbg" in n for n in names) >= 2:
        break
    time.sleep(0.005)
report = apply_placement(plan, strict=True, steps=[zmq_step])
stop = threading.Event()
late = threading.Thread(target=stop.wait)  # like CUDA's threads started during warm-up
late.start()
before = masks()
finish_warmup(report, strict=True)
after = masks()
stop.set(); late.join()
import gc
print(json.dumps({"before": before, "after": after, "labels": report.as_labels(), "log": report.log_block(),
                  "helpers": list(plan.helper_cores),
                  "gc_enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


@needs_two_cores
def test_pins_hot_thread_and_keeps_helper_threads_off_its_core():
    hot = ALLOWED[0]
    out = run_child(CHILD_PIN.replace("[HOT]", f"[{hot}]"))
    assert out["helpers"] and hot not in out["helpers"]
    helper_list = format_cpulist(out["helpers"])
    assert out["after"]["HOT"] == str(hot)
    zmq_threads = {k: v for k, v in out["after"].items() if "ZMQbg" in k}
    assert zmq_threads and all(v == helper_list for v in zmq_threads.values()), out["after"]
    # a thread started by the pinned thread inherits its core until finish_warmup moves it
    assert out["before"]["born-late"] == str(hot) and out["after"]["born-late"] == helper_list
    labels = out["labels"]
    assert labels["pin"] == labels["zmq_io"] == labels["threads"] == labels["gc_freeze"] == "applied"
    assert labels["refused"] == "0" and labels["hot_cores"] == str(hot)
    assert "hot thread" in out["log"] and "after warm-up" in out["log"]
    assert out["gc_enabled"] is False and out["frozen"] > 0


def test_nonexistent_core_is_refused_and_strict_raises():
    p = plan_placement(cpu([99999]), "cpu")
    before = os.sched_getaffinity(0)
    report = apply_placement(p, strict=False)  # nothing to pin: safe inside pytest
    assert os.sched_getaffinity(0) == before
    assert [s.name for s in report.refusals] == ["core", "pin"]
    assert "core 99999 does not exist" in report.log_block()
    assert report.as_labels()["refused"] == "2" and report.as_labels()["pin"] == "refused"
    with pytest.raises(ConfigError, match=r"cpu.strict: placement refused: core: core 99999 does not exist"):
        apply_placement(p, strict=True)


def _bare_plan(**kw) -> PlacementPlan:
    base = dict(mode="explicit", hot_cores=(), helper_cores=(), device="cpu", gpu_pci=None, numa_node=None,
                isolated=(), rt_priority=0, mlockall=False, gc_freeze=False)
    return PlacementPlan(**{**base, **kw})


def test_kernel_refusal_of_a_core_is_recorded_with_its_errno():
    # bypass planning: the kernel itself refuses a core it does not have
    report = apply_placement(_bare_plan(hot_cores=(4095,)), strict=False)
    (step,) = report.refusals
    assert step.name == "pin" and "EINVAL" in step.detail


def test_zmq_affinity_refuses_unusable_core_instead_of_letting_libzmq_abort(zctx):
    step = configure_zmq_context(zctx, _bare_plan(hot_cores=(0,), helper_cores=(4095,)))
    assert step.outcome == "refused" and "4095" in step.detail
    zctx.socket(1).close()  # libzmq would abort the process here had the core been set


@needs_two_cores
def test_confine_process_moves_another_process():
    child = subprocess.Popen(["sleep", "60"])
    try:
        step = confine_process(child.pid, _bare_plan(hot_cores=(ALLOWED[0],), helper_cores=(ALLOWED[1],)))
        assert step.outcome == "applied"
        assert os.sched_getaffinity(child.pid) == {ALLOWED[1]}
    finally:
        child.kill()
        child.wait()


CHILD_RT = """
import json, os
from hft_infer.affinity import apply_placement, plan_placement, current_placement
from hft_infer.config import CpuConfig
report = apply_placement(plan_placement(CpuConfig(cores="none", rt_priority=1, mlockall=True), "cpu"), strict=False)
print(json.dumps({"rt": report.outcome("rt_priority"), "mlock": report.outcome("mlockall"),
                  "now": current_placement(), "log": report.log_block()}))
"""


def _no_limits():
    import resource

    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))


def test_rt_priority_and_mlockall_refused_without_privileges():
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root without setpriv: cannot drop CAP_SYS_NICE/CAP_IPC_LOCK for the child")
        prefix = ("setpriv", "--bounding-set=-sys_nice,-ipc_lock", "--")
    out = run_child(CHILD_RT, prefix=prefix, preexec_fn=_no_limits)
    assert out["rt"] == "refused" and out["now"]["policy"] == "other"
    assert "RLIMIT_RTPRIO 0" in out["log"] and "LimitRTPRIO" in out["log"]
    assert out["mlock"] == "refused" and "RLIMIT_MEMLOCK 64 KiB" in out["log"]


def test_rt_priority_and_mlockall_as_this_user():
    """Whatever this user may do, the report must agree with the kernel's view."""
    out = run_child(CHILD_RT)
    assert out["rt"] in ("applied", "refused") and out["mlock"] in ("applied", "refused")
    assert (out["now"]["policy"] == "fifo") == (out["rt"] == "applied")
    assert (int(out["now"]["vm_locked_kib"]) > 0) == (out["mlock"] == "applied")


def test_log_block_and_labels_name_every_step():
    p = _bare_plan(hot_cores=(1,), helper_cores=(0,), warnings=("something odd",))
    report = PlacementReport(p)
    report.add(Step("pin", "applied", "hot thread on 1"))
    block = report.log_block()
    assert block.splitlines()[0].startswith("placement: mode=explicit") and "hot=1 helpers=0" in block
    assert "warning: something odd" in block
    labels = report.as_labels()
    assert labels["pin"] == "applied" and labels["mlockall"] == "off" and labels["warnings"] == "1"
    assert all(isinstance(v, str) for v in labels.values())


CHILD_ZMQ = """
import json, os
import zmq
from hft_infer.affinity import configure_zmq_context, plan_placement
from hft_infer.config import CpuConfig
plan = plan_placement(CpuConfig(cores=[HOT]), "cpu")
ctx = zmq.Context()
step = configure_zmq_context(ctx, plan)
sock = ctx.socket(zmq.PUB)  # IO threads start here, with the mask set above
import time
for _ in range(2000):  # a libzmq thread sets its mask, then its name, once it runs
    masks = {}
    for tid in os.listdir("/proc/self/task"):
        name = open(f"/proc/self/task/{tid}/comm").read().strip()
        masks[name] = sorted(os.sched_getaffinity(int(tid)))
    if sum("ZMQbg" in name for name in masks) >= 2:
        break
    time.sleep(0.005)
print(json.dumps({"outcome": step.outcome, "masks": masks, "helpers": list(plan.helper_cores)}))
"""


@needs_two_cores
def test_zmq_io_threads_start_on_helper_cores_without_any_pinning():
    out = run_child(CHILD_ZMQ.replace("[HOT]", f"[{ALLOWED[0]}]"))
    assert out["outcome"] == "applied"
    zmq_masks = [m for name, m in out["masks"].items() if "ZMQbg" in name]
    assert zmq_masks and all(m == out["helpers"] for m in zmq_masks)
    assert ALLOWED[0] not in out["helpers"]


# --------------------------------------------------------------------------- the preview command


def test_preview_command_says_why_torch_gives_no_gpu_address():
    """`python -m hft_infer.affinity auto cuda:0` used to say "torch: not found" with torch installed."""
    r = subprocess.run([sys.executable, "-m", "hft_infer.affinity", "auto", "cuda:0"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("placement: mode=auto device=cuda:0")
    gpu_line = next(line for line in r.stdout.splitlines() if line.strip().startswith("gpu "))
    import torch

    if "via torch" not in gpu_line:  # no CUDA device here: the line must say so, with torch's version
        assert f"torch: {torch.__version__}" in gpu_line and "not found" not in gpu_line.split(";")[0], gpu_line
        assert "sees no CUDA device" in gpu_line or "CUDA device(s), no cuda:0" in gpu_line


def test_preview_command_places_a_shard_of_several():
    r = subprocess.run([sys.executable, "-m", "hft_infer.affinity", "auto", "cpu", f"1/{len(ALLOWED)}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "slot 1 -> core" in r.stdout and (len(ALLOWED) < 2 or "kept free of helpers" in r.stdout)


@pytest.mark.parametrize("args, message", [(["x"], "error: cores: bad cpulist"),
                                           (["auto", "tpu"], "error: device 'tpu'"),
                                           (["auto", "cpu", "2/2"], "error: shard '2/2'")])
def test_preview_command_rejects_bad_arguments_in_one_line(args, message):
    r = subprocess.run([sys.executable, "-m", "hft_infer.affinity", *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith(message) and len(r.stderr.splitlines()) == 1
