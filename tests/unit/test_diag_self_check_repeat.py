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
from hft_infer.kernels.persistent import CNT_DONE, LINE, MB_REQ
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


def test_stuck_report_reads_the_broadcast_and_each_counters_round(monkeypatch):
    # a kernel left after request 29's broadcast (8 entries, a step) with every program through request 28 and
    # layer 0 of request 29, and 31 of 32 programs through layer 1: the report names the round and who is missing
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kstep = cpu_kernel_step("lstm_a", 8)
    k = kstep.persistent(PersistentEngine.request_ring(kstep, max_batch=8, max_inflight=2), max_programs=33)
    assert k.programs == 32
    k.sync[MB_REQ] = 29 | (8 << 32)
    k.sync[CNT_DONE * LINE] = 32 * 28
    k.sync[(CNT_DONE + 1) * LINE] = 32 * 29
    k.sync[(CNT_DONE + 2) * LINE] = 32 * 28 + 31
    assert diag.stuck_report(k) == [
        "sync block (32 programs): last broadcast request 29, 8 entries, kind 0",
        "done counter 896 = 28 rounds + 0 of 32 programs",
        "layer 0 counter 928 = 29 rounds + 0 of 32 programs",
        "layer 1 counter 927 = 28 rounds + 31 of 32 programs"]


def test_the_tool_runs_the_self_check_stream_on_the_cpu_engine(capsys):
    assert diag.main(["--engine", "eager", "--repeat", "2", "--slots", "4"]) == 0
    out = capsys.readouterr().out
    assert "the self-check stream (300 rows" in out and "4 instruments" in out
    assert "default  failed 0 of 2 runs (eager" in out
    with pytest.raises(SystemExit):
        diag.parse_args(["--variants", "default,fast"])


def test_isolated_variants_run_in_processes_of_their_own(capfd):
    # what the persistent engine does by default (a kernel that stops answering takes its process with it),
    # here on the CPU engine: the variant's count comes from the child; a child past its time limit is named
    assert diag.main(["--engine", "eager", "--repeat", "1", "--slots", "4", "--isolate"]) == 0
    assert "default  failed 0 of 1 runs (eager" in capfd.readouterr().out
    assert diag.main(["--engine", "eager", "--repeat", "1", "--slots", "4", "--isolate",
                      "--variant-timeout", "0.01"]) == 0
    assert "default  ended without its count (exit timeout; --variant-timeout 0.01 s)" in capfd.readouterr().out


def test_a_variant_reaches_the_kernel_the_engine_builds(monkeypatch):
    # both diag tools set LstmPersistent's keyword defaults before the engine builds its kernel (the engine passes
    # neither option): built as for a GPU on the CPU (never started), each variant's limits are the kernel's
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kstep = cpu_kernel_step("lstm_a", 8)
    built, engines_own = {}, dict(LstmPersistent.__init__.__kwdefaults__)
    for name, options in VARIANTS.items():
        monkeypatch.setattr(LstmPersistent.__init__, "__kwdefaults__", {**engines_own, **options})
        k = kstep.persistent(PersistentEngine.request_ring(kstep, max_batch=8, max_inflight=2), max_programs=132)
        built[name] = (k.ring.inline_entries, k.emit_entries, k.wide_rows // k.states)
    assert built == {"default": (2, 2, 2), "inline0": (0, 2, 2), "emit0": (2, 0, 2), "plain": (0, 0, 2),
                     "narrow": (2, 2, 1 << 20)}
