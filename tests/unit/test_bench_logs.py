"""Every log under docs/bench/ says where it comes from: it starts with a provenance block
(`commit: ...`, as tools/gpu_session.sh writes it, or one added beside a PROVENANCE.md for runs
that printed none), or is a service's own log starting with a `#` line that names its run."""

from __future__ import annotations

from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"


def test_every_bench_log_starts_with_its_provenance():
    logs = sorted(BENCH.rglob("*.log"))
    assert logs, "docs/bench/ holds no logs"
    missing = [str(p.relative_to(BENCH)) for p in logs
               if not p.read_text(errors="replace").startswith(("commit:", "#"))]
    assert not missing, f"logs without a provenance block: {missing}"


def test_a_log_that_points_to_a_provenance_file_has_one_beside_it():
    for p in sorted(BENCH.rglob("*.log")):
        if "PROVENANCE.md beside this log" in p.read_text(errors="replace")[:300]:
            assert (p.parent / "PROVENANCE.md").exists(), p
