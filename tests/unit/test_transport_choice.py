"""Choosing the transport: the config keys, `--transport`, and the error without the shm extra."""

from __future__ import annotations

import pytest

from hft_infer import channels
from hft_infer.app.cli import build_parser
from hft_infer.config import ConfigError, expand_shm_service, load_config
from hft_infer.transport import shm
from hft_infer.transport.sockets import EndpointError


def test_defaults_are_zmq_and_names_follow_the_service_name():
    cfg = load_config(None, ["service.name=alpha"])
    assert cfg.ingest.transport == cfg.egress.transport == "zmq"
    assert expand_shm_service(cfg.ingest.shm_service, cfg) == "hft-infer/alpha/md"
    assert expand_shm_service(cfg.egress.shm_service, cfg) == "hft-infer/alpha/decisions"
    assert channels.feed_address(load_config(None, ["service.name=a", "ingest.transport=iceoryx2"])) \
        == "iceoryx2:hft-infer/a/md"


@pytest.mark.parametrize("override, fragment", [
    ("ingest.transport=shm", "ingest.transport"),
    ("egress.shm_service={host}/x", "only placeholder"),
    ("ingest.shm_service=a b", "shm_service"),
    ("egress.shm_buffer=0", "shm_buffer"),
])
def test_bad_values_name_the_field(override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(None, [override])


def test_check_transports_names_the_extra(monkeypatch):
    cfg = load_config(None, ["egress.transport=iceoryx2"])
    monkeypatch.setattr(shm, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"egress.transport.*pip install 'hft-infer\[shm\]'"):
        channels.check_transports(cfg)
    channels.check_transports(load_config(None, []))  # zmq needs nothing


def test_check_transports_refuses_a_bad_expanded_name():
    cfg = load_config(None, ["ingest.transport=iceoryx2", "ingest.shm_service=a//b"])
    with pytest.raises(ConfigError, match="ingest.shm_service"):
        channels.check_transports(cfg)


def test_service_names_and_addresses():
    shm.check_service_name("hft-infer/x.y_z-1/md")
    for bad in ("", "/a", "a/", "a//b", "a b", "x" * 256):
        with pytest.raises(EndpointError):
            shm.check_service_name(bad)
    assert shm.service_of("iceoryx2:a/b") == "a/b" and shm.service_of("ipc:///tmp/x") is None


@pytest.mark.parametrize("command", [["serve"], ["bench"], ["replay", "synthetic"], ["record", "--out", "x"]])
def test_transport_option_is_two_overrides(command):
    args = build_parser().parse_args([*command, "--set", "service.name=a", "--transport", "iceoryx2",
                                      "--set", "egress.transport=zmq"])
    assert args.overrides == ["service.name=a", "ingest.transport=iceoryx2", "egress.transport=iceoryx2",
                              "egress.transport=zmq"]
    cfg = load_config(None, args.overrides)
    assert (cfg.ingest.transport, cfg.egress.transport) == ("iceoryx2", "zmq")  # later --set wins
