"""The persistent engine's program budget (runner/select.py): a share of the GPU's SMs per shard,
so that N shards' spinning kernels are resident together, or the configured count; the config
key validated. (The engine's refusal of a kernel over budget runs on the GPU:
tests/integration/test_gpu_engines.py.)"""

from __future__ import annotations

import pytest

from hft_infer.config import ConfigError, load_config
from hft_infer.runner.select import persistent_program_budget


@pytest.mark.parametrize("sets, sms, want", [
    ([], 132, 132),  # one service: the whole GPU
    (["universe.shard_count=4", "universe.shard_index=1"], 132, 33),
    (["universe.shard_count=8"], 132, 16),
    (["universe.shard_count=3"], 132, 44),
    (["universe.shard_count=200"], 132, 1),  # never 0
    (["universe.shard_count=4", "runner.persistent_programs=64"], 132, 64),  # configured: as given
])
def test_the_budget_is_an_equal_share_of_the_sms_per_shard_unless_configured(sets, sms, want):
    cfg = load_config(None, ["universe.instruments=256", *sets])
    assert persistent_program_budget(cfg, sms) == want


def test_a_negative_program_count_is_a_config_error():
    with pytest.raises(ConfigError, match="persistent_programs"):
        load_config(None, ["runner.persistent_programs=-1"])


def test_a_gpu_shard_without_an_mps_daemon_in_sight_says_so_in_its_engine_reason(monkeypatch):
    from hft_infer.runner import select

    monkeypatch.setattr(select.os.path, "exists", lambda p: False)  # no system-wide daemon on this machine
    one = load_config(None, [])
    shard = load_config(None, ["universe.instruments=8", "universe.shard_count=4"])
    assert select.shared_gpu_warning(one, {}) == ""  # a lone service shares nothing
    assert "WARNING" in select.shared_gpu_warning(shard, {}) and "MPS" in select.shared_gpu_warning(shard, {})
    found = select.shared_gpu_warning(shard, {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/x"})
    assert "WARNING" not in found and "MPS daemon found" in found
