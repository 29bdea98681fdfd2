"""The persistent kernels, compiled for the H200 (sm_90) exactly as the engine launches them,
read request data and model state only through coherent loads (no GPU needed: Triton's
bundled ptxas). This is the check that found issue 13's wrong results: Triton's pipeliner
had turned those volatile loads into L1-cached cp.async copies (kernels/persistent.py,
NUM_STAGES). Both runs go through tools/check_persistent_asm.py in a child process without
TRITON_INTERPRET (the kernels' tests in tests/kernels switch the interpreter on)."""

from __future__ import annotations

from tool_run import run_compile_tool


def _run(*args: str):
    return run_compile_tool("check_persistent_asm.py", *args)


def test_every_persistent_kernel_reads_requests_and_state_coherently():
    cases = "floor,mlp_small,lstm_a,lstm_a/stream,lstm_b:bf16"
    proc = _run("--cases", cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:]}
    assert sorted(rows) == sorted(cases.split(","))
    for case, line in rows.items():
        assert line.rstrip().endswith("none"), line
        assert int(line.split()[2]) > 0, f"{case}: no volatile load at all: {line}"


def test_the_check_finds_the_pipelined_loads_that_gave_wrong_results():
    # the launch options before the fix (Triton's default of 3 stages): the payload and state
    # loads become cp.async.ca, and the tool says so and fails
    proc = _run("--cases", "mlp_small,lstm_a", "--num-stages", "3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for case in ("mlp_small", "lstm_a"):
        line = next(row for row in proc.stdout.splitlines() if row.startswith(case + " "))
        assert "cp.async copies" in line, line


def test_bad_arguments_are_refused_with_a_reason():
    proc = _run("--cases", "no_such_preset")
    assert proc.returncode == 2
    assert "no_such_preset" in proc.stderr
    env_proc = run_compile_tool("check_persistent_asm.py", interpreter=True)
    assert env_proc.returncode == 2 and "TRITON_INTERPRET" in env_proc.stderr


def test_the_mlp_phases_build_compiles_with_its_six_stamps():
    # the diagnostic build tools/sweep_persistent_geometry.py times (MlpPersistent(phases=True)): the
    # same coherence check, and one %globaltimer read per stamp; the engine's build reads the clock never
    from hft_infer.kernels.mlp_persistent import PHASE_STAMPS

    proc = _run("--cases", "mlp_small", "--phases")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(row for row in proc.stdout.splitlines() if row.startswith("mlp_small "))
    assert line.rstrip().endswith("none") and int(line.split()[3]) == len(PHASE_STAMPS) == 6, line
    engine = _run("--cases", "mlp_small")
    line = next(row for row in engine.stdout.splitlines() if row.startswith("mlp_small "))
    assert int(line.split()[3]) == 0, line
    refused = _run("--cases", "lstm_a", "--phases")
    assert refused.returncode == 2 and "MLP cases only" in refused.stderr
