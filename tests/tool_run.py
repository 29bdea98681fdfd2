"""Running a tool of tools/ in a child process, for tests of the tools that compile kernels for a
GPU: without TRITON_INTERPRET (the kernels' tests in tests/kernels switch the interpreter on, and
the interpreter's kernels do not compile)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_compile_tool(name: str, *args: str, interpreter: bool = False) -> subprocess.CompletedProcess:
    """tools/`name` with `args`, from the repository root; stdout and stderr captured as text.
    interpreter=True runs it with TRITON_INTERPRET=1 (a tool's refusal is tested that way)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpreter:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, str(ROOT / "tools" / name), *args], capture_output=True, text=True,
                          env=env, timeout=600, cwd=ROOT)
