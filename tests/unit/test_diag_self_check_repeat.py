"""tools/diag_self_check_repeat.py: the report that says where a persistent engine's scores leave
the CPU's (by instrument, with the path of the request each was last in), the request paths by
batch size, and the tool end to end on the CPU engine (which agrees with itself)."""

from __future__ import annotations

from types import SimpleNamespace

import diag_self_check_repeat as diag
import numpy as np
import pytest
from diag_kernel_repeat import VARIANTS
from kernel_compile import cpu_kernel_step

from hft_infer.kernels.lstm_persistent import LstmPersistent
from hft_infer.runner.gpu import PersistentEngine


def test_request_paths_follow_the_kernels_limits():
    k = SimpleNamespace(ring=SimpleNamespace(inline_entries=2), emit_entries=2, wide_rows=100, states=50)
    assert diag.request_paths(k, [1, 2, 4, 8]) == ["inline+emitted", "inline+emitted+wide", "wide", "wide"]
    narrow = SimpleNamespace(ring=SimpleNamespace(inline_entries=0), emit_entries=0, wide_rows=0, states=50)
    assert diag.request_paths(narrow, [1, 64]) == ["-", "-"]
    assert diag.request_paths(None, [1]) == ["-"]  # the eager engine: no kernel


def test_mismatch_report_names_each_diverging_instrument_and_its_previous_request():
    # 3 requests over instruments 0..3: [0, 1] [2, 3, 0] [1]; instrument 0 goes wrong at row 4 (its second
    # appearance, request 1) and instrument 1 at row 5 (request 2)
    slots = np.array([0, 1, 2, 3, 0, 1])
    batches = [2, 3, 1]
    paths = ["inline", "wide", "inline"]
    want = np.zeros(6)
    assert diag.mismatch_report(want.astype(np.float32), want, slots, batches, paths) == []
    got = want.copy()
    got[4], got[5] = 0.5, 0.002
    lines = diag.mismatch_report(got.astype(np.float32), want, slots, batches, paths)
    assert lines[0].startswith("2 of 6 scores differ") and "in 2 instrument(s)" in lines[0]
    assert "instrument 0: 1 bad from row 4 (request 1, batch 3, wide, 0.5 off); last before it in request 0 " \
           "(batch 2, inline)" in lines[1]
    assert "instrument 1: 1 bad from row 5 (request 2, batch 1, inline" in lines[2]
    got[0] = np.nan  # a NaN is a mismatch too
    assert "instrument 0: 2 bad from row 0" in diag.mismatch_report(got, want, slots, batches, paths)[1]
    assert "its first row" in diag.mismatch_report(got, want, slots, batches, paths)[1]


def test_the_tool_runs_the_self_check_stream_on_the_cpu_engine(capsys):
    assert diag.main(["--engine", "eager", "--repeat", "2", "--slots", "4"]) == 0
    out = capsys.readouterr().out
    assert "the self-check stream (300 rows" in out and "4 instruments" in out
    assert "default  failed 0 of 2 runs (eager" in out
    with pytest.raises(SystemExit):
        diag.parse_args(["--variants", "default,fast"])


def test_a_variant_reaches_the_kernel_the_engine_builds(monkeypatch):
    # both diag tools set LstmPersistent's keyword defaults before the engine builds its kernel (the engine passes
    # neither option): built as for a GPU on the CPU (never started), each variant's limits are the kernel's
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kstep = cpu_kernel_step("lstm_a", 8)
    built, engines_own = {}, dict(LstmPersistent.__init__.__kwdefaults__)
    for name, options in VARIANTS.items():
        monkeypatch.setattr(LstmPersistent.__init__, "__kwdefaults__", {**engines_own, **options})
        k = kstep.persistent(PersistentEngine.request_ring(kstep, max_batch=8, max_inflight=2), max_programs=132)
        built[name] = (k.ring.inline_entries, k.emit_entries)
    assert built == {"default": (2, 2), "inline0": (0, 2), "emit0": (2, 0), "plain": (0, 0)}
