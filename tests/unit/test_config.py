"""Typed config: defaults load, every shipped config validates, errors name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from hft_infer.config import ConfigError, dump_toml, expand_endpoint, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted(str(p) for p in (ROOT / "configs").glob("*.toml")))
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.scheduler.max_batch <= cfg.runner.max_bucket


def test_embedded_default_equals_repo_default():
    assert load_config(None) == load_config(str(ROOT / "configs" / "default.toml"))


def test_dump_round_trips(tmp_path):
    cfg = load_config(None, ["scheduler.class_by_instrument={ \"7\" = 0 }", "universe.ids=[5, 9, 11]",
                             "scheduler.class_by_kind={ trade = 1 }", "cpu.cores=[3]",
                             """service.run_dir='runs/a "quoted" \\ dir'"""])
    f = tmp_path / "c.toml"
    f.write_text(dump_toml(cfg))
    assert load_config(str(f)) == cfg
    assert cfg.service.run_dir == 'runs/a "quoted" \\ dir'


@pytest.mark.parametrize("override, fragment", [
    ("scheduler.max_wiat_us=3", "scheduler.max_wiat_us: unknown field"),
    ("schedulr.policy=\"greedy\"", "schedulr: unknown field"),
    ("scheduler.max_age_us=-1", "scheduler.max_age_us"),
    ("scheduler.policy=fastest", "scheduler.policy"),
    ("ingest.poll_mode=spin", "ingest.poll_mode"),
    ("runner.buckets=[4, 2]", "runner"),
    ("runner.device=\"tpu\"", "runner"),
    ("cpu.cores=[0, -3]", "cpu.cores[1]"),
    ("universe.shard_index=3", "universe"),
    ("scheduler.default_class=7", "default_class"),
    ("universe.shard_weights=[1.0, 2.0]", "`shard_weights` has 2 entries for 64 instruments"),
    ("universe.shard_weights=[-1.0]", "universe.shard_weights[0]"),
    ("universe.shard_count=65", "`shard_count` 65 exceeds the universe's 64 instruments"),
    ("service.name=\"has space\"", "service.name"),
])
def test_errors_name_the_field(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg


def test_toml_syntax_error_has_line(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[ingest]\npoll_mode = \n")
    with pytest.raises(ConfigError, match=r"line 2"):
        load_config(str(f))


def test_missing_file_and_unknown_builtin():
    with pytest.raises(ConfigError, match="cannot read"):
        load_config("/nonexistent/x.toml")
    with pytest.raises(ConfigError, match="no built-in config"):
        load_config("builtin:nope")


def test_bare_string_override_and_typed_override():
    cfg = load_config(None, ["scheduler.policy=window", "scheduler.max_wait_us=75"])
    assert cfg.scheduler.policy == "window" and cfg.scheduler.max_wait_us == 75


def test_endpoint_templates(monkeypatch, tmp_path):
    monkeypatch.setenv("HFT_INFER_RUNTIME_DIR", str(tmp_path))
    cfg = load_config(None, ["service.name=shard-1"])
    assert expand_endpoint(cfg.ingest.endpoint, cfg) == f"ipc://{tmp_path}/shard-1-md.sock"


def test_sharding_partitions_the_universe():
    owned = [load_config(None, [f"universe.shard_index={i}", "universe.shard_count=3"]).universe.owned_ids()
             for i in range(3)]
    assert sorted(sum(owned, [])) == list(range(64))
    assert all(set(a).isdisjoint(b) for a in owned for b in owned if a is not b)


# --------------------------------------------------------------------------- messages a new user meets


def _error(tmp_path, text: str | None = None, overrides=()) -> str:
    path = None
    if text is not None:
        path = tmp_path / "my.toml"
        path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(None if path is None else str(path), list(overrides))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_misspelled_field_suggests_the_right_one(tmp_path):
    msg = _error(tmp_path, "[scheduler]\nmax_wiat_us = 3\n")
    assert msg == f"{tmp_path / 'my.toml'}: scheduler.max_wiat_us: unknown field (did you mean max_wait_us?)"
    assert _error(tmp_path, "[schedulr]\npolicy = 'greedy'\n").endswith("schedulr: unknown field "
                                                                         "(did you mean scheduler?)")
    assert _error(tmp_path, "[scheduler]\nzzz = 3\n").endswith("scheduler.zzz: unknown field")  # nothing close


def test_bad_enum_lists_the_allowed_values(tmp_path):
    msg = _error(tmp_path, "[runner]\nengine = 'gpu'\n")
    assert msg.endswith('runner.engine: expected one of "auto", "eager", "graph", "persistent", got "gpu"')
    assert _error(tmp_path, "[cpu]\ncores = 'all'\n").endswith(
        'cpu.cores: expected a list or one of "auto", "none", got "all"')
    assert _error(tmp_path, "[scheduler]\nclass_by_kind = { quotes = 1 }\n").endswith(
        'scheduler.class_by_kind.quotes: unknown key (did you mean quote?); expected one of "quote", "trade"')


def test_a_bad_set_is_blamed_on_the_set_argument(tmp_path):
    msg = _error(tmp_path, overrides=["scheduler.max_wiat_us=3"])
    assert msg == "--set scheduler.max_wiat_us=3: scheduler.max_wiat_us: unknown field (did you mean max_wait_us?)"
    assert _error(tmp_path, overrides=["runner.engine=gpu"]).startswith("--set runner.engine=gpu: runner.engine: ")
    assert _error(tmp_path, overrides=["scheduler.max_age_us=-1"]) == (
        "--set scheduler.max_age_us=-1: scheduler.max_age_us: expected `int` >= 1, got -1")
    # a section's own check names the --set that wrote into it
    assert _error(tmp_path, overrides=["universe.shard_index=3"]).startswith("--set universe.shard_index=3: universe")
    assert _error(tmp_path, overrides=["scheduler=3"]).startswith("--set scheduler=3: scheduler: expected a table")


def test_a_bad_file_is_still_the_files_fault_with_unrelated_sets(tmp_path):
    msg = _error(tmp_path, "[runner]\nengine = 'gpu'\n", overrides=["scheduler.policy=window"])
    assert msg.startswith(f"{tmp_path / 'my.toml'}: runner.engine: ")
    # a rule across sections: the file and the --set together
    msg = _error(tmp_path, "[runner]\nbuckets = [1, 2, 4]\n", overrides=["scheduler.max_batch=8"])
    assert msg.startswith(f"{tmp_path / 'my.toml'} with --set scheduler.max_batch=8: runner.buckets top out at 4")
