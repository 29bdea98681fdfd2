"""The host side of the persistent LSTM kernel (kernels/lstm_persistent.py) and of
tools/sweep_persistent_geometry.py: the phase stamps' layout a request's row holds and the phases
worked out of it (the persistent MLP's phases build too), the wide tiling's and the emitted pass's
conditions and buffers, the sweep's geometry and emit options, the timed run the sweep shares with
tools/bench_kernels.py. (The kernel's stores and both tilings run on a GPU only:
tests/kernels/test_kernel_persistent.py's GPU cases, `lstm_a-window-fp32-phases` among them.)"""

from __future__ import annotations

import numpy as np
import pytest
import sweep_persistent_geometry as sweep
import torch
from kernel_compile import cpu_kernel_step

from hft_infer.kernels.lstm import prepare_lstm_weights
from hft_infer.kernels.lstm_persistent import (
    EMIT_ENTRIES,
    WIDE_BLOCK_H_FACTOR,
    WIDE_BLOCK_M,
    WIDE_MIN_ENTRIES,
    LstmPersistent,
    pack_wide,
    phase_stamps,
)
from hft_infer.runner.gpu import PersistentEngine

SMS = 132  # an H100's or H200's: the programs a kernel may take (on a CPU device: given)


@pytest.fixture
def compiled_mode(monkeypatch):
    """The kernels' objects built as for a GPU (the test suite runs Triton's interpreter, under which
    a persistent kernel takes one program and no stamps: kernels/common.interpreting); nothing here
    launches a kernel."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _kernel(phases: bool = False, timing: bool = True, case: str = "lstm_a", max_batch: int = 8,
            **kw) -> LstmPersistent:
    """A persistent kernel built on the CPU (never started) from the engine's own (`kw`: LstmPersistent's
    other options; without `wide`, the engine's wide weights if it has them)."""
    kstep = cpu_kernel_step(case, max_batch)
    ring = PersistentEngine.request_ring(kstep, max_batch=max_batch, max_inflight=2)
    k = kstep.persistent(ring, max_programs=kw.pop("max_programs", SMS))
    kw.setdefault("wide", k.wide)
    return LstmPersistent(k.w, ring, k.h.shape[0], k.thresholds, k.held, window=k.states if k.window_mode else None,
                          max_programs=k.programs, timing=timing, phases=phases, **kw)


def test_phase_stamps_name_every_stamp_of_a_request_row():
    names = phase_stamps(2)
    assert names == ["detect", "done", "broadcast", "layer 0", "barrier 0", "layer 1", "barrier 1",
                     "last program sees it"]
    # the kernel writes the last program's stamp at 3 + 2 L (lstm_persistent.py): the last name's index
    assert names.index("last program sees it") == 3 + 2 * 2
    assert len(phase_stamps(3)) == 4 + 2 * 3


def test_stamps_rows_by_request_and_device_time_from_their_first_two(compiled_mode):
    k = _kernel(phases=True)
    assert k.phases and k.stamps == len(phase_stamps(2))
    assert k.times.numel() == k.stamps * k.time_slots
    rows = k.times.view(k.time_slots, k.stamps)
    for seq in (1, 2, 3):  # request s at row (s - 1) % time_slots
        rows[seq - 1] = torch.arange(k.stamps) * 100 + seq
        rows[seq - 1, 1] = 1000 * seq + seq  # done
    got = k.device_stamps_ns(2, 3)
    assert got.shape == (2, k.stamps) and got[0, 0] == 2 and got[1, 2] == 203
    assert k.device_times_ns(1, 3).tolist() == [1000, 2000, 3000]
    # wrapped: request time_slots + 1 shares row 0 with request 1
    assert k.device_stamps_ns(k.time_slots + 1, k.time_slots + 1)[0, 0] == 1


def test_the_service_build_keeps_two_stamps_a_request(compiled_mode):
    plain = _kernel(phases=False)
    assert not plain.phases and plain.stamps == 2 and plain.times.numel() == 2 * plain.time_slots
    # phases without timing stamps nothing: the kernel's PHASES constexpr follows timing
    untimed = _kernel(phases=True, timing=False)
    assert not untimed.phases
    with pytest.raises(RuntimeError, match="timing=True"):
        untimed.device_stamps_ns(1, 1)


def test_phase_medians_are_the_gaps_between_consecutive_stamps():
    # detect 0, broadcast 400, layer 0 ends 3,400, its barrier 5,900, layer 1 9,200, barrier 10,400, done 12,000;
    # the last program read the broadcast at 800
    one = [0, 12_000, 400, 3_400, 5_900, 9_200, 10_400, 800]
    other = [v + 7 for v in one]  # another request, the same gaps
    got = sweep.phase_medians(np.array([one, other]), layers=2)
    assert got == pytest.approx({"broadcast": 0.4, "layer 0": 3.0, "barrier 0": 2.5, "layer 1": 3.3,
                                 "barrier 1": 1.2, "head": 1.6, "last sees": 0.8})
    assert sum(v for k, v in got.items() if k != "last sees") == pytest.approx(12.0)  # detect -> done


def test_geometry_option_is_checked(capsys):
    a = sweep.parse_args(["--geometries", "4/0/4/0,8/64/4/64,0/0/0/0/32", "--batches", "1,8"])
    assert a.geometries == [(4, 0, 4, 0, 0), (8, 64, 4, 64, 0), (0, 0, 0, 0, 32)] and a.batches == [1, 8]
    assert sweep.geometry_label((8, 0, 4, 0, 0)) == "bh=8 bm=auto warps=4 progs=auto"
    assert sweep.geometry_label((0, 0, 0, 0, 32)) == "bh=auto bm=auto warps=auto progs=auto + wide bm=32"
    for bad in (["--geometries", "4/0/4"], ["--geometries", "4/x/4/0"], ["--geometries", "4/0/-1/0"],
                ["--geometries", "4/0/4/0/32/1"], ["--models", "mlp_large"]):
        with pytest.raises(SystemExit):
            sweep.parse_args(bad)
    assert "geometry" in capsys.readouterr().err
    # --emit crosses every geometry with the emitted pass's limits (a sixth field)
    a = sweep.parse_args(["--geometries", "4/0/4/0,0/0/0/0/32", "--emit", "2,0"])
    assert a.geometries == [(4, 0, 4, 0, 0, 2), (4, 0, 4, 0, 0, 0), (0, 0, 0, 0, 32, 2), (0, 0, 0, 0, 32, 0)]
    assert sweep.geometry_label((0, 0, 0, 0, 32, 2)).endswith("+ wide bm=32 emit<=2")
    for bad in (["--emit", "3"], ["--emit", "x"], ["--emit", "-2"]):
        with pytest.raises(SystemExit):
            sweep.parse_args(bad)
    assert "--emit" in capsys.readouterr().err


def test_the_engine_builds_lstm_windows_with_the_wide_tiling(compiled_mode):
    k = _kernel()
    assert k.wide_reason == "in use" and k.wide.block_h == WIDE_BLOCK_H_FACTOR * k.w.block_h
    assert k.programs % k.wide.n_blocks == 0  # the same programs, placed anew
    assert k.wide_rows == WIDE_MIN_ENTRIES * k.states and k.wide_block_m == WIDE_BLOCK_M
    # each program's private projection rows sized for the wider tiling's units
    assert k.xp.numel() == k.programs * k.ring.max_batch * 4 * k.wide.block_h
    consts = k._launch_spec()[3]
    assert (consts["WIDE_ROWS"], consts["BH_W"], consts["NB_W"], consts["BLOCK_M_W"]) == (
        k.wide_rows, k.wide.block_h, k.wide.n_blocks, WIDE_BLOCK_M)


def test_one_tiling_where_the_wide_one_cannot_serve(compiled_mode):
    kstep = cpu_kernel_step("lstm_a", 8)
    wide = pack_wide(kstep._params, kstep.w)
    stream = _kernel(case="lstm_a/stream", wide=wide)  # stream mode: not measured, so not taken
    assert stream.wide is None and stream.wide_rows == 0 and "stream" in stream.wide_reason
    assert cpu_kernel_step("lstm_a/stream", 8).persistent(stream.ring, max_programs=SMS).wide_reason == "none given"
    narrow = _kernel(wide=None)
    assert narrow.wide_reason == "none given" and narrow._launch_spec()[3]["WIDE_ROWS"] == 0
    assert narrow.xp.numel() == narrow.programs * narrow.ring.max_batch * 4 * narrow.w.block_h
    # a tiling whose hidden blocks do not divide the programs: 48 programs of 8 units (16 blocks x 3) and
    # wide weights of 4 units (32 blocks)
    odd = LstmPersistent(wide, narrow.ring, narrow.h.shape[0], narrow.thresholds, narrow.held, window=50,
                         max_programs=48, wide=kstep.w)
    assert odd.programs == 48 and odd.wide is None
    assert odd.wide_reason == "48 programs do not split into 32 hidden blocks"
    # a program holding every unit already: no wider tiling
    whole = prepare_lstm_weights(kstep._params, device="cpu", block_h=128)
    assert pack_wide(kstep._params, whole) is None and pack_wide(kstep._params, wide).block_h == 16


def test_wide_weights_of_another_model_are_refused(compiled_mode):
    other = cpu_kernel_step("lstm_b", 8)
    with pytest.raises(ValueError, match="not packed from the same model"):
        _kernel(wide=pack_wide(other._params, other.w))
    with pytest.raises(ValueError, match="wide_block_m"):
        _kernel(wide_block_m=24)


def test_the_engine_answers_small_window_requests_from_the_emitted_pass(compiled_mode):
    k = _kernel()
    assert EMIT_ENTRIES and k.emit_entries == EMIT_ENTRIES and k.emit_reason == "in use"
    spec = k._launch_spec()[3]
    assert spec["EB"] == EMIT_ENTRIES and spec["KP"] == 128  # lstm_a: K = 128 in registers
    # its new h per layer and entry [L, n, H], n <= EB
    assert k.emit_h.numel() == k.w.layers * EMIT_ENTRIES * k.w.hidden
    assert _kernel(emit_entries=8).emit_entries == 8  # up to the ring's batch (8 here) ...
    assert _kernel(emit_entries=16).emit_entries == 8  # ... and no further
    assert _kernel(max_batch=6, emit_entries=8).emit_entries == 4  # a batch of 6: the largest power of two it holds


def test_no_emitted_pass_where_it_cannot_serve(compiled_mode):
    off = _kernel(emit_entries=0)
    assert off.emit_entries == 0 and off.emit_reason.startswith("off") and off._launch_spec()[3]["EB"] == 0
    assert off.emit_h.numel() == off.w.layers * off.w.hidden  # a placeholder the kernel never reads
    stream = _kernel(case="lstm_a/stream", wide=None)
    assert stream.emit_entries == 0 and "stream mode" in stream.emit_reason
    wide_k = cpu_kernel_step("lstm_c", 8)  # hidden 1280: [2, 2048, 16] products would not fit in registers
    ring = PersistentEngine.request_ring(wide_k, max_batch=8, max_inflight=2)
    big = LstmPersistent(wide_k.w, ring, 9, wide_k.thresholds, wide_k.held, window=50, max_programs=4096)
    assert big.emit_entries == 0 and "registers" in big.emit_reason
    for bad in (-1, 3, 6):
        with pytest.raises(ValueError, match="emit_entries"):
            _kernel(emit_entries=bad)


def test_timed_run_checks_then_times_each_batch_and_always_stops_the_kernel():
    """tools/bench_kernels.py's Driver.timed_run (the sweep's and bench_kernels' run), its orchestration on
    a stand-in kernel and ring (the real ones need a GPU): fill steps at MAX_B checked, one checked step
    per batch, 50 untimed and `steps` timed ones per batch, the first timed request's seq; the kernel
    stopped on the way out, an error included."""
    import bench_kernels

    calls = []

    class Kernel:
        def precompile(self):
            calls.append("precompile")

        def start(self):
            calls.append("start")

        def stop(self):
            calls.append("stop")

    class Ring:
        seq = 0

    d = bench_kernels.Driver.__new__(bench_kernels.Driver)
    d.kernel, d.ring = Kernel(), Ring()

    def step(b, check=False):
        d.ring.seq += 1
        calls.append((b, check))
        return 1e-7 * b if check else 1000 + d.ring.seq

    d.step = step
    errs, lat = d.timed_run([1, 8], steps=3, fill_steps=2)
    assert calls[:2] == ["precompile", "start"] and calls[-1] == "stop"
    assert calls[2:6] == [(bench_kernels.MAX_B, True)] * 2 + [(1, True), (8, True)]
    assert errs == {1: 1e-7, 8: 8e-7}
    # batch 1: seqs 5-54 untimed, 55-57 timed; batch 8: 58-107 untimed, 108-110 timed
    assert lat[1][0] == 55 and lat[1][1].tolist() == [1055, 1056, 1057]
    assert lat[8][0] == 108 and lat[8][1].tolist() == [1108, 1109, 1110]

    calls.clear()

    def failing(b, check=False):
        raise RuntimeError("watchdog")

    d.step = failing
    with pytest.raises(RuntimeError, match="watchdog"):
        d.timed_run([1], steps=3, fill_steps=1)
    assert calls == ["precompile", "start", "stop"]


def test_the_mlp_phases_build_names_and_rows_its_six_stamps(compiled_mode):
    # MlpPersistent(phases=True): detect, done, then the kernel's stamp indices 2..5 in PHASE_STAMPS' order
    # (mlp_persistent.py writes broadcast at 2, the lead's partials at 3, the count's completion at 4, the last
    # program's sight of the mailbox at 5); the engine's build keeps two, and phases without timing none
    from hft_infer.kernels.mlp_persistent import PHASE_STAMPS, MlpPersistent

    assert PHASE_STAMPS == ("detect", "done", "broadcast", "lead's partials", "all arrived",
                            "last program sees it")
    eng = cpu_kernel_step("mlp_small", 8).persistent(PersistentEngine.request_ring(
        cpu_kernel_step("mlp_small", 8), max_batch=8, max_inflight=2))
    assert not eng.phases and eng.stamps == 2
    k = MlpPersistent(eng.w, eng.ring, eng.thresholds, eng.held, timing=True, phases=True)
    assert k.phases and k.stamps == len(PHASE_STAMPS) and k.times.numel() == 6 * k.time_slots
    assert not MlpPersistent(eng.w, eng.ring, eng.thresholds, eng.held, timing=False, phases=True).phases


def test_mlp_phase_medians_split_detect_to_done():
    # detect 0, broadcast 400, the lead's partials 3,000, every arrival 5,000, done 14,000; last sees 700
    one = [0, 14_000, 400, 3_000, 5_000, 700]
    got = sweep.mlp_phase_medians(np.array([one, [v + 3 for v in one]]))
    assert got == pytest.approx({"broadcast": 0.4, "partials": 2.6, "arrivals": 2.0, "finish": 9.0,
                                 "last sees": 0.7})
    assert sum(v for k, v in got.items() if k != "last sees") == pytest.approx(14.0)  # detect -> done
    a = sweep.parse_args(["--models", "mlp_small", "--geometries", "64/128/0/8"])
    assert sweep.geometry_label(a.geometries[0], "mlp_small") == "bn=64 bk=128 ksplit=auto warps=8"
    with pytest.raises(SystemExit):  # the LSTMs' option
        sweep.parse_args(["--models", "mlp_small", "--emit", "2"])


def test_the_mlp_kernel_takes_the_engines_warps_and_a_checked_batch_tile(compiled_mode):
    # the engine's build: NUM_WARPS a program and the smallest batch tile whatever the ring's max batch (a
    # larger request loops over tiles); block_b sets the tile for the sweep, a power of two within the
    # launched kernel's bounds
    from hft_infer.kernels.mlp import BLOCK_B_MAX, BLOCK_B_MIN
    from hft_infer.kernels.mlp_persistent import NUM_WARPS, MlpPersistent

    for max_batch in (8, 64):
        kstep = cpu_kernel_step("mlp_small", max_batch)
        eng = kstep.persistent(PersistentEngine.request_ring(kstep, max_batch=max_batch, max_inflight=2))
        consts = eng._launch_spec()[3]
        assert eng.num_warps == consts["num_warps"] == NUM_WARPS == 4
        assert eng.block_b == consts["BLOCK_B"] == BLOCK_B_MIN == 16
    k = MlpPersistent(eng.w, eng.ring, eng.thresholds, eng.held, block_b=BLOCK_B_MAX, num_warps=8)
    assert k.block_b == k._launch_spec()[3]["BLOCK_B"] == BLOCK_B_MAX and k._launch_spec()[3]["num_warps"] == 8
    for bad in (0, 8, 24, 2 * BLOCK_B_MAX):
        with pytest.raises(ValueError, match="block_b"):
            MlpPersistent(eng.w, eng.ring, eng.thresholds, eng.held, block_b=bad)


def test_the_sweeps_fifth_mlp_field_is_the_batch_tile(capsys):
    from hft_infer.kernels.mlp import BLOCK_B_MAX, BLOCK_B_MIN

    assert sweep.MLP_BLOCK_B == tuple(b for b in range(BLOCK_B_MIN, BLOCK_B_MAX + 1) if not b & (b - 1))
    a = sweep.parse_args(["--models", "mlp_small", "--geometries", "0/0/0/4/16,0/0/0/0"])
    assert a.geometries == [(0, 0, 0, 4, 16), (0, 0, 0, 0, 0)]
    assert sweep.geometry_label(a.geometries[0], "mlp_small") == "bn=auto bk=auto ksplit=auto warps=4 bb=16"
    assert sweep.geometry_label(a.geometries[1], "mlp_small") == "bn=auto bk=auto ksplit=auto warps=auto"
    for bad in (["--models", "mlp_small", "--geometries", "0/0/0/0/8"],
                ["--models", "mlp_small", "--geometries", "0/0/0/0/64"],
                ["--models", "mlp_small,lstm_a", "--geometries", "0/0/0/0/16"]):
        with pytest.raises(SystemExit):
            sweep.parse_args(bad)
    err = capsys.readouterr().err
    assert "block_b" in err and "on its own" in err
