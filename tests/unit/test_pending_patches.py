"""docs/pending/: service code waiting for its GPU run, kept as patches (docs/pending/README.md). Each
one must still apply to this tree -- a change that moves the lines it touches makes it fail here, so
that it is rebased then and not found broken in the session that has a device -- and each is listed
in the README's table with how it lands."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PENDING = ROOT / "docs" / "pending"


def _patches() -> list[Path]:
    return sorted(PENDING.glob("*.patch"))


def test_every_pending_patch_is_listed_in_the_readme():
    readme = (PENDING / "README.md").read_text()
    for patch in _patches():
        assert f"`{patch.name}`" in readme, f"{patch.name} is not in docs/pending/README.md's table"


@pytest.mark.parametrize("patch", _patches(), ids=lambda p: p.name)
def test_a_pending_patch_still_applies(patch: Path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout (a clone, as CI's)")
    proc = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, (f"{patch.name} no longer applies to this tree: rebase it "
                                  f"(docs/pending/README.md)\n{proc.stderr}")
