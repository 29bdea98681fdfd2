"""Where a service's feed and decisions are, from its config; CURVE keys from key files.

A client that runs beside `hft-infer serve` reads the same config (and the same
`--set` overrides) to find the endpoints, so that the two cannot disagree on a
path, on which side binds, or on topic framing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hft_infer.config import expand_endpoint, expand_shm_service, load_config
from hft_infer.transport.curve import load_client_keys, load_server_keys
from hft_infer.transport.sockets import CurveClient, CurveServer

KeyPath = str | os.PathLike


@dataclass(frozen=True)
class ServiceEndpoints:
    """A service's endpoints as its clients see them (`{runtime_dir}` and `{name}` filled in)."""

    feed: str
    """`ingest.endpoint`: where a feed publisher sends quotes and trades."""
    feed_bind: bool
    """True when the publisher binds `feed` (the service connects: `ingest.bind = false`, the usual)."""
    feed_socket_type: Literal["pub", "push"]
    """`pub` for a SUB ingest, `push` for a PULL ingest (`ingest.socket_type`)."""
    feed_topic_frame: bool
    """`ingest.topic_frame`: each feed message is preceded by its 4-byte topic frame."""
    decisions: str
    """`egress.endpoint`: where decisions and Status come from (the service binds it unless
    `egress.bind = false`, when it is a forwarder's)."""
    decisions_topic_frame: bool
    """`egress.topic_frame`."""
    egress_mode: Literal["batch", "per_instrument"]
    """`egress.mode`: DecisionBatch frames, or one Decision frame per answer on its instrument's topic."""
    allow_remote: bool
    """`security.allow_remote`: non-loopback endpoints without CURVE are allowed."""
    feed_transport: Literal["zmq", "iceoryx2"] = "zmq"
    """`ingest.transport`; with iceoryx2, `feed` is the service name `ingest.shm_service`."""
    feed_shm_buffer: int = 4096
    """`ingest.shm_buffer`."""
    decisions_transport: Literal["zmq", "iceoryx2"] = "zmq"
    """`egress.transport`; with iceoryx2, `decisions` is the service name `egress.shm_service`."""
    decisions_shm_buffer: int = 4096
    """`egress.shm_buffer`."""


def service_endpoints(config: str | None = None, overrides: Sequence[str] = ()) -> ServiceEndpoints:
    """The endpoints of the service that `hft-infer serve -c CONFIG --set OVERRIDE...` runs.

    `config`: a TOML path or `builtin:NAME`; None is the default config. Raises
    `hft_infer.errors.ConfigError` (one line) for a bad config. `{runtime_dir}`
    resolves in this process's environment (`$HFT_INFER_RUNTIME_DIR`, ...), which
    must therefore match the service's."""
    cfg = load_config(config, list(overrides))
    ic, ec = cfg.ingest, cfg.egress
    return ServiceEndpoints(
        feed=(expand_shm_service(ic.shm_service, cfg) if ic.transport == "iceoryx2"
              else expand_endpoint(ic.endpoint, cfg)),
        feed_bind=not cfg.ingest.bind,
        feed_socket_type="pub" if cfg.ingest.socket_type == "sub" else "push",
        feed_topic_frame=cfg.ingest.topic_frame,
        decisions=(expand_shm_service(ec.shm_service, cfg) if ec.transport == "iceoryx2"
                   else expand_endpoint(ec.endpoint, cfg)),
        decisions_topic_frame=cfg.egress.topic_frame,
        egress_mode=cfg.egress.mode,
        allow_remote=cfg.security.allow_remote,
        feed_transport=ic.transport,
        feed_shm_buffer=ic.shm_buffer,
        decisions_transport=ec.transport,
        decisions_shm_buffer=ec.shm_buffer,
    )


def curve_keys(secret: KeyPath | None, server_public: KeyPath | None) -> CurveServer | CurveClient | None:
    """CURVE keys from key files (`hft-infer keys generate`): with `server_public` (the peer's
    `NAME.key`) this side is the CURVE client; without it, the CURVE server. None without
    `secret`. Raises `CurveKeyError` (one line) for a missing or malformed file."""
    if secret is None:
        if server_public is not None:
            raise ValueError("curve_server_public needs curve_secret (this side's NAME.key_secret)")
        return None
    if server_public is not None:
        return load_client_keys(secret, server_public)
    return load_server_keys(secret)
