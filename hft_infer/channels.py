"""The service's two channels, ZeroMQ or iceoryx2, picked from the config in one place.

`ingest.transport` / `egress.transport` choose; each transport gives the opened socket (a
zmq socket or a transport.shm wrapper), the address it reports, and the Ingest / Egress class
that reads or writes it. Everything past the read phase of a burst (decode, checks,
sequencing, accounting, answers) is the same code for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from hft_infer.config import Config, expand_endpoint, expand_shm_service
from hft_infer.egress import Egress, ShmEgress
from hft_infer.errors import ConfigError
from hft_infer.ingest import Ingest, ShmIngest
from hft_infer.transport import shm, sockets


@dataclass
class Channel:
    sock: object
    address: str
    cls: type
    topic_frame: bool
    shm: bool


def check_transports(cfg: Config) -> None:
    """ConfigError (exit 2 at check-config and serve) when iceoryx2 is chosen but not installed,
    or a service name is not one iceoryx2 accepts once `{name}` is filled in."""
    for section in ("ingest", "egress"):
        sc = getattr(cfg, section)
        if sc.transport != "iceoryx2":
            continue
        try:
            shm.check_service_name(expand_shm_service(sc.shm_service, cfg))
        except sockets.EndpointError as e:
            raise ConfigError(f"{section}.shm_service: {e}") from None
        if not shm.available():
            raise ConfigError(f"{section}.transport = \"iceoryx2\" needs the iceoryx2 package: {shm.EXTRA}")


def open_ingest(cfg: Config, ctx, *, topics, curve) -> Channel:
    ic = cfg.ingest
    if ic.transport == "iceoryx2":
        sub = shm.ShmSubscriber(expand_shm_service(ic.shm_service, cfg), buffer=ic.shm_buffer,
                                role=f"{cfg.service.name}-ingest")
        return Channel(sub, sub.address, ShmIngest, False, True)
    sock, resolved = sockets.open_ingest(
        ctx, expand_endpoint(ic.endpoint, cfg), socket_type=ic.socket_type, bind_socket=ic.bind, topics=topics,
        rcv_hwm=ic.rcv_hwm, max_msg_size=ic.max_msg_size_bytes, allow_remote=cfg.security.allow_remote, curve=curve)
    return Channel(sock, resolved, Ingest, ic.topic_frame, False)


def open_egress(cfg: Config, ctx, *, curve) -> Channel:
    ec = cfg.egress
    if ec.transport == "iceoryx2":
        pub = shm.ShmPublisher(expand_shm_service(ec.shm_service, cfg), buffer=ec.shm_buffer, block=False,
                               role=f"{cfg.service.name}-egress")
        return Channel(pub, pub.address, ShmEgress, False, True)
    sock, resolved = sockets.open_egress(
        ctx, expand_endpoint(ec.endpoint, cfg), bind_socket=ec.bind, snd_hwm=ec.snd_hwm,
        allow_remote=cfg.security.allow_remote, curve=curve)
    return Channel(sock, resolved, Egress, ec.topic_frame, False)


def feed_address(cfg: Config) -> str:
    """Where a feed publisher sends (the tools' --endpoint): `iceoryx2:SERVICE` or the zmq endpoint."""
    ic = cfg.ingest
    if ic.transport == "iceoryx2":
        return shm.PREFIX + expand_shm_service(ic.shm_service, cfg)
    return expand_endpoint(ic.endpoint, cfg)


def decisions_address(cfg: Config) -> str:
    """Where decisions come from: `iceoryx2:SERVICE` or the zmq endpoint."""
    ec = cfg.egress
    if ec.transport == "iceoryx2":
        return shm.PREFIX + expand_shm_service(ec.shm_service, cfg)
    return expand_endpoint(ec.endpoint, cfg)
