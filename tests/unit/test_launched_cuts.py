"""Every cut of the graph engine's LSTM step (kernels/lstm.py `phased_geometry`) compiles for the
H200 (sm_90) and fits an SM's shared memory, checked without a GPU through Triton's bundled ptxas
(tools/check_launched_cuts.py, in a child process without TRITON_INTERPRET: the kernels' tests in
tests/kernels switch the interpreter on). The launches are those of the engine's own
`KernelStep.launch`, recorded in place of the kernel."""

from __future__ import annotations

from tool_run import run_compile_tool


def _run(*args: str):
    return run_compile_tool("check_launched_cuts.py", *args)


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()[1:] if line.strip()]


def test_every_cut_of_the_window_step_compiles_for_the_h200():
    proc = _run("--cases", "lstm_a,lstm_a:bf16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(proc.stdout)
    for case in ("lstm_a", "lstm_a:bf16"):
        cuts = {(r[2], r[3], r[4]) for r in rows if r[0] == case}
        # three cuts up to batch 64 (50, 400 and 3,200 open windows), each L + 1 = 3 phase launches
        assert len(cuts) == 3, rows
        assert sum(r[0] == case for r in rows) == 9
    assert all(r[-1] == "none" and int(r[6]) > 0 for r in rows), proc.stdout


def test_the_check_fails_a_launch_that_does_not_fit():
    proc = _run("--cases", "lstm_a", "--max-batch", "2", "--max-shared", "1000")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "shared memory" in proc.stdout and "> 1000" in proc.stdout
