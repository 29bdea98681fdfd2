"""The host side of the persistent LSTM kernel's phase stamps (kernels/lstm_persistent.py, `phases`)
and of tools/sweep_persistent_geometry.py, which reads them: the stamp layout a request's row holds,
the phases worked out of it, the geometry option's checks. (The kernel's stores run on a GPU only:
tests/kernels/test_kernel_persistent.py's `lstm_a-window-fp32-phases` case.)"""

from __future__ import annotations

import numpy as np
import pytest
import sweep_persistent_geometry as sweep
import torch
from kernel_compile import cpu_kernel_step

from hft_infer.kernels.lstm_persistent import LstmPersistent, phase_stamps
from hft_infer.runner.gpu import PersistentEngine

SMS = 132  # an H100's or H200's: the programs a kernel may take (on a CPU device: given)


@pytest.fixture
def compiled_mode(monkeypatch):
    """The kernels' objects built as for a GPU (the test suite runs Triton's interpreter, under which
    a persistent kernel takes one program and no stamps: kernels/common.interpreting); nothing here
    launches a kernel."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _kernel(phases: bool, timing: bool = True) -> LstmPersistent:
    """lstm_a's persistent kernel as the engine builds it, on the CPU (never started)."""
    kstep = cpu_kernel_step("lstm_a", 8)
    ring = PersistentEngine.request_ring(kstep, max_batch=8, max_inflight=2)
    k = kstep.persistent(ring, max_programs=SMS)
    return LstmPersistent(k.w, ring, k.h.shape[0], k.thresholds, k.held, window=50, max_programs=SMS,
                          timing=timing, phases=phases)


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
    a = sweep.parse_args(["--geometries", "4/0/4/0,8/64/4/64", "--batches", "1,8"])
    assert a.geometries == [(4, 0, 4, 0), (8, 64, 4, 64)] and a.batches == [1, 8]
    assert sweep.geometry_label((8, 0, 4, 0)) == "bh=8 bm=auto warps=4 progs=auto"
    for bad in (["--geometries", "4/0/4"], ["--geometries", "4/x/4/0"], ["--geometries", "4/0/-1/0"],
                ["--models", "mlp_small"]):
        with pytest.raises(SystemExit):
            sweep.parse_args(bad)
    assert "geometry" in capsys.readouterr().err
