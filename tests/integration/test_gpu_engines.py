"""GPU engines against the CPU reference on the same stream of rows (skipped without CUDA).

The CPU engine (the models' torch executors) and a GPU engine each get their
own feature store; the same rows are written into both and the same batches
(distinct slots, every row in order) are stepped. Scores agree within float32
rounding (different summation order); actions agree wherever the score is not
within that rounding of a threshold.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

N_SLOTS = 8
BUCKETS = [1, 2, 4, 8]


def _runtime(engine: str, preset: str, mode: str = "window", *, self_check: bool = True, extra: tuple = ()):
    from hft_infer.config import load_config
    from hft_infer.runner.select import build_runtime

    cfg = load_config(None, ["model.checkpoint=\"\"", f"model.preset=\"{preset}\"", f"model.mode=\"{mode}\"",
                             f"runner.engine=\"{engine}\"", "runner.buckets=[1, 2, 4, 8]",
                             "scheduler.max_batch=8", "universe.instruments=8",
                             "runner.device=\"cpu\"" if engine == "eager" else "runner.device=\"cuda\"",
                             f"runner.self_check={'true' if self_check else 'false'}", *extra])
    return build_runtime(cfg, N_SLOTS)


def _gpu_runtime_or_refusal(engine: str, preset: str, mode: str):
    """The self-checked engine, or None when its self-check refused it (the refusal must name
    the self-check: any other failure is an error of the test)."""
    from hft_infer.config import ConfigError

    try:
        return _runtime(engine, preset, mode)
    except ConfigError as e:
        assert "self-check failed" in str(e), str(e)
        return None


def _drive(rt, rows: np.ndarray, slots_seq: np.ndarray, batches: list[int], *, fresh: bool = True):
    """Write rows (one per event, slot slots_seq[i]) and step them in the given batch sizes: the
    self-check's own driver (runner/self_check.py), after the engine's warm-up."""
    from hft_infer.runner.self_check import drive

    if not rt.engine.ready:
        rt.engine.warm_up()
    return drive(rt.engine, rt.store, rows, slots_seq, batches, fresh=fresh)


def _drive_pipelined(rt, rows: np.ndarray, slots_seq: np.ndarray, batches: list[int]):
    """As _drive, but with as many steps in flight as the engine allows before collecting."""
    from hft_infer.runner.self_check import stage

    store, eng = rt.store, rt.engine
    if not eng.ready:
        eng.warm_up()
    store.reset()
    scores, actions = [], []
    i = 0
    for b in batches:
        if not eng.can_submit:
            sc, ac = eng.finish()
            scores.append(sc.copy())
            actions.append(ac.copy())
        stage(eng, store, rows[i:i + b], slots_seq[i:i + b])
        eng.submit(b)
        i += b
    while eng.in_flight:
        sc, ac = eng.finish()
        scores.append(sc.copy())
        actions.append(ac.copy())
    return np.concatenate(scores), np.concatenate(actions)


def _stream(n: int, width: int, seed: int = 0):
    """The self-check's stream of book-like rows in batches of distinct slots (runner/self_check.py)."""
    from hft_infer.runner.self_check import check_stream

    return check_stream(width, N_SLOTS, max(BUCKETS), rows=n, seed=seed)


CASES = [("lstm_a", "window"), ("mlp_small", "window"), ("lstm_a", "stream")]


def _agrees_one_step_at_a_time_and_pipelined(gpu, rows, slots, batches, s_cpu, a_cpu) -> None:
    """The GPU engine's results equal the CPU's, stepped one at a time and with several steps
    in flight (the same results, in order); the engine is reset in between."""
    s_gpu, a_gpu = _drive(gpu, rows, slots, batches)
    _agree(s_cpu, a_cpu, s_gpu, a_gpu)
    gpu.engine.reset()
    s_pipe, a_pipe = _drive_pipelined(gpu, rows, slots, batches)
    _agree(s_cpu, a_cpu, s_pipe, a_pipe)


def _agree(s_cpu, a_cpu, s_gpu, a_gpu) -> None:
    diff = np.abs(s_cpu - s_gpu)
    assert diff.max() < 1e-4, diff.max()  # fp32 both, different summation order: ~1e-6 seen
    near = np.abs(np.abs(s_cpu) - 0.2) < 1e-4  # at a threshold a rounding difference may flip the action
    assert np.array_equal(a_cpu[~near], a_gpu[~near])


@pytest.mark.parametrize("preset, mode", CASES)
def test_graph_engine_matches_cpu_reference(preset, mode):
    cpu = _runtime("eager", preset, mode)
    gpu = _runtime("graph", preset, mode)
    try:
        assert gpu.engine.name == "graph"
        rows, slots, batches = _stream(600, cpu.store.width)
        s_cpu, a_cpu = _drive(cpu, rows, slots, batches)
        _agrees_one_step_at_a_time_and_pipelined(gpu, rows, slots, batches, s_cpu, a_cpu)
    finally:
        gpu.engine.close()  # several steps in flight: the same results, in order


@pytest.mark.parametrize("preset, mode", CASES)
def test_persistent_engine_matches_the_cpu_or_is_refused_at_start_up(preset, mode):
    """A persistent engine that serves must agree with the CPU on a stream the self-check has
    not seen (other rows, other batches); one that disagrees must have been refused, and the
    same engine built without the self-check must indeed disagree (the check saw something
    real, not a fault of its own)."""
    cpu = _runtime("eager", preset, mode)
    rows, slots, batches = _stream(600, cpu.store.width)
    s_cpu, a_cpu = _drive(cpu, rows, slots, batches)
    gpu = _gpu_runtime_or_refusal("persistent", preset, mode)
    if gpu is None:
        gpu = _runtime("persistent", preset, mode, self_check=False)
        try:
            s_gpu, _ = _drive(gpu, rows, slots, batches)
        finally:
            gpu.engine.close()
        assert np.abs(s_cpu - s_gpu).max() > 1e-4  # refused for a reason
        return
    try:
        _agrees_one_step_at_a_time_and_pipelined(gpu, rows, slots, batches, s_cpu, a_cpu)
    finally:
        gpu.engine.close()


def test_a_shard_s_persistent_kernel_fits_its_share_of_the_sms_and_still_matches_the_cpu():
    """Four shards on one GPU: each persistent kernel holds at most SMs / 4 programs (so that all
    four are resident at once under MPS) and, so sized, still agrees with the CPU."""
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cpu = _runtime("eager", "lstm_a")
    rows, slots, batches = _stream(300, cpu.store.width, seed=5)
    s_cpu, a_cpu = _drive(cpu, rows, slots, batches)
    whole = _runtime("persistent", "lstm_a", self_check=False)
    try:
        whole_programs = whole.engine.kernel.programs
    finally:
        whole.engine.close()
    gpu = _runtime("persistent", "lstm_a", extra=("universe.shard_count=4", "universe.shard_index=2"))
    try:
        assert gpu.engine.kernel.programs <= sms // 4 < whole_programs  # sized down from the whole GPU's
        _agrees_one_step_at_a_time_and_pipelined(gpu, rows, slots, batches, s_cpu, a_cpu)
    finally:
        gpu.engine.close()


@pytest.mark.parametrize("preset, programs", [("lstm_a", 8), ("mlp_small", 16)])
def test_a_persistent_kernel_over_its_program_budget_is_refused_with_both_counts(preset, programs):
    from hft_infer.config import ConfigError

    with pytest.raises(ConfigError, match=r"persistent_programs") as e:
        _runtime("persistent", preset, extra=(f"runner.persistent_programs={programs}",))
    assert str(programs) in str(e.value)


def test_reset_slots_on_the_device_matches_the_cpu():
    """(The graph engine; the persistent engine's resets are checked by its kernel tests:
    through the runner it fails its self-check before any reset matters.)"""
    cpu = _runtime("eager", "lstm_a", "stream")
    gpu = _runtime("graph", "lstm_a", "stream")
    try:
        rows, slots, batches = _stream(300, cpu.store.width, seed=3)
        half = len(batches) // 2
        n_half = sum(batches[:half])
        out = []
        for rt in (cpu, gpu):
            s1, _ = _drive(rt, rows[:n_half], slots[:n_half], batches[:half])
            rt.engine.reset_slots([0, 3, 5])
            for s in (0, 3, 5):  # what the service does with a Reset: the rows start again too
                rt.store.array[s] = 0
                rt.store.count[s] = 0
            s2, a2 = _drive(rt, rows[n_half:], slots[n_half:], batches[half:], fresh=False)
            out.append((s1, s2, a2))
    finally:
        gpu.engine.close()
    np.testing.assert_allclose(out[0][0], out[1][0], atol=1e-4)
    np.testing.assert_allclose(out[0][1], out[1][1], atol=1e-4)


def test_graphs_cannot_be_captured_twice():
    from hft_infer.runner.gpu import EngineFailure

    rt = _runtime("graph", "lstm_a")
    with pytest.raises(EngineFailure, match="captured once"):
        rt.engine.capture()


def test_the_engines_launch_their_graphs_through_libcudart_and_it_does_what_replay_does():
    """kernels/launch.py: on a CUDA host the engines' graphs are launched by cudaGraphLaunch
    through ctypes, not torch's replay; such a launch does the captured work on its stream.
    (A CUDA error comes back as GraphLaunchError, which the engines make an EngineFailure: not
    provoked here, since a launch on a bad handle may crash the process rather than fail.)"""
    import torch

    from hft_infer.kernels.launch import cudart, graph_launcher

    assert cudart() is not None  # torch's libcudart is mapped: the engines take the direct launch
    rt = _runtime("graph", "lstm_a")
    assert all(f is not g.replay for f, g in zip(rt.engine._launchers.values(), rt.engine.graphs.values()))
    src = torch.arange(64, dtype=torch.float32).pin_memory()
    dst = torch.zeros(64, device="cuda")
    stream = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        dst.copy_(src, non_blocking=True)
        dst.mul_(2.0)
    launch = graph_launcher(g, stream)
    assert launch is not g.replay
    torch.cuda.synchronize()  # dst's zeros, written on the default stream, are in place
    src.fill_(3.0)
    launch()
    stream.synchronize()
    assert dst.cpu().tolist() == [6.0] * 64
    src.fill_(5.0)
    for _ in range(3):  # launched again: the same graph, new inputs in the same place
        launch()
    stream.synchronize()
    assert dst.cpu().tolist() == [10.0] * 64
    # the persistent engine's request ring launches its copy graphs the same way
    prt = _runtime("persistent", "lstm_a", self_check=False)
    if not prt.engine.ready:
        prt.engine.warm_up()
    ring = prt.engine.ring
    assert ring._launchers is not None
    assert all(f is not g.replay for row_f, row_g in zip(ring._launchers, ring._graphs) for f, g in zip(row_f, row_g))
    prt.engine.close()


def test_persistent_engine_stops_and_its_watchdog_trips():
    from hft_infer.runner.gpu import EngineFailure

    rt = _runtime("persistent", "lstm_a", self_check=False)  # liveness, not results
    eng = rt.engine
    slots, positions = eng.request()
    slots[:1] = 0
    positions[:1] = 0
    eng.step(1)  # alive
    eng.kernel.stop()  # stop flag: the kernel exits (stop() returns only once it has)
    assert not eng.kernel.running
    eng.watchdog_ns = 200_000_000
    with pytest.raises(EngineFailure, match="watchdog"):
        eng.step(1)  # nobody answers: a stuck engine is detected, not waited on forever


@pytest.mark.parametrize("preset, mode", CASES)
def test_auto_picks_the_self_checked_graph_engine_for_every_family_and_says_why(preset, mode):
    """Graph, timed against the CPU engine in its reason; or, where the graph engine is right but
    more than SPEED_MARGIN times slower than the CPU (runner/self_check.py), eager, saying so."""
    rt = _runtime("auto", preset, mode)
    try:
        if rt.engine.name == "graph":
            assert "graph works here" in rt.engine.reason and "ms on the CPU engine" in rt.engine.reason
            assert rt.conflate == (preset == "mlp_small")  # the MLP reads its window from the host ring
        else:
            assert rt.engine.name == "eager" and "graph is slower than the CPU engine here" in rt.engine.reason
    finally:
        rt.engine.close()
