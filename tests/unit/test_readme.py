"""README.md stays in step with the code it documents."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_is_current():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_config_reference.py")],
                         capture_output=True, text=True, check=True).stdout
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- config-reference:start -->") + len("<!-- config-reference:start -->")
    end = readme.index("<!-- config-reference:end -->")
    assert readme[start:end].strip() == out.strip(), "run: python tools/gen_config_reference.py --write"


def test_readme_names_the_setup_commands():
    readme = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 triton==3.8.0 && pip install -e '.[dev]'" in readme
    assert "python -m pytest -q" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install torch==2.13.0 triton==3.8.0 && pip install -e '.[dev]'" in ci
    assert "python -m pytest -q" in ci
