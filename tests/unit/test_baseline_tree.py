"""tools/baseline_tree.sh lays an earlier commit's package out as installed, so that every
subpackage a side-by-side run imports comes from that commit: pyproject.toml maps
hft_infer.kernels (and transport, replay, configs) to top-level folders, and an archive left at the
repository's layout would take those from the editable install, i.e. from this tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "baseline_tree.sh"
MAPPED = ("kernels", "transport", "replay", "configs")

PROBE = """
import importlib, sys
for name in ("hft_infer",) + tuple("hft_infer." + m for m in sys.argv[1:]):
    print(importlib.import_module(name).__file__)
"""


def _has_git() -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _has_git(), reason="needs the repository's .git (git archive)")
@pytest.mark.parametrize("from_tgz", [False, True])
def test_every_mapped_subpackage_comes_from_the_baseline(tmp_path, from_tgz):
    src = "HEAD"
    if from_tgz:  # what a device machine gets (no .git there): the archive as a file
        src = str(tmp_path / "base.tgz")
        subprocess.run(f"git -C {ROOT} archive HEAD hft_infer transport kernels replay configs | gzip > {src}",
                       shell=True, check=True)
    out = subprocess.run(["bash", str(SCRIPT), src, str(tmp_path / "base"), sys.executable],
                         capture_output=True, text=True, check=True)
    py = Path(out.stdout.strip())
    assert py == tmp_path / "base" / "py" and py.exists()
    # run from a folder of its own: neither this tree's folders nor the script's are on the path
    got = subprocess.run([str(py), "-c", PROBE, *MAPPED], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.split()
    pkg = (tmp_path / "base" / "pkg" / "hft_infer").resolve()
    assert len(got) == 1 + len(MAPPED)
    for path in got:
        assert Path(path).resolve().is_relative_to(pkg), path
