"""`hft-infer check-config`: validate a config as `serve` would, and print it resolved.

Each check that `serve` would refuse at start is an error (one line, exit 2):

- the file, its types and values (`config.load_config`: the field's path,
  "did you mean", the allowed values, which --set was at fault);
- every endpoint's syntax and the security policy (`security.check_security`:
  non-loopback endpoints without CURVE or `security.allow_remote`, in all the
  forms `transport.sockets.is_local_endpoint` judges remote; CURVE key files;
  the control endpoint and the dashboard's host);
- the transports: iceoryx2 chosen without the `shm` extra installed, or a service name
  iceoryx2 would refuse (`channels.check_transports`);
- the model checkpoint: loaded with the loader `serve` uses, so a missing,
  unreadable or mismatched file fails here (this imports torch: seconds).

Warnings (risky but allowed, or about this host) go to stderr. The config is
printed with every default filled in and `{runtime_dir}` and `{name}` expanded
in its endpoints, as this host would run it. Nothing is bound: a running
service would make its own endpoints look busy.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import msgspec

from hft_infer.channels import check_transports
from hft_infer.config import Config, ConfigError, dump_toml, expand_shm_service, load_config, runtime_dir
from hft_infer.security import check_key_permissions, check_security, config_endpoints


def main(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.overrides)
    warnings = check_security(cfg)
    check_transports(cfg)
    warnings += [w for w in check_key_permissions(cfg, args.file) if w not in warnings]
    version = check_model(cfg)
    warnings += host_warnings(cfg)
    for w in warnings:
        print(f"hft-infer check-config: warning: {w}", file=sys.stderr)
    print(f"# {args.file or 'builtin:default'}{''.join(f' --set {o}' for o in args.overrides)}, resolved on "
          f"{socket.gethostname()}: {{runtime_dir}} = {runtime_dir()}, {{name}} = {cfg.service.name}; "
          f"model {version}")
    print(dump_toml(resolved(cfg)), end="")
    return 0


def resolved(cfg: Config) -> Config:
    """The config with `{runtime_dir}` and `{name}` filled in wherever `serve` fills them (endpoints)."""
    ep = {name: endpoint for name, endpoint, _ in config_endpoints(cfg)}
    return msgspec.structs.replace(
        cfg,
        ingest=msgspec.structs.replace(cfg.ingest, endpoint=ep["ingest.endpoint"],
                                       shm_service=expand_shm_service(cfg.ingest.shm_service, cfg)),
        egress=msgspec.structs.replace(cfg.egress, endpoint=ep["egress.endpoint"],
                                       shm_service=expand_shm_service(cfg.egress.shm_service, cfg)),
        metrics=msgspec.structs.replace(cfg.metrics, control_endpoint=ep["metrics.control_endpoint"]))


def check_model(cfg: Config) -> str:
    """Load the checkpoint (or model.module) as `serve` does (runner.select.build_runtime); ConfigError if it cannot."""
    from hft_infer.models.custom import load_configured  # imports torch

    try:
        _, version = load_configured(cfg.model)
    except ValueError as e:  # CheckpointError, CustomModelError
        raise ConfigError(f"model: {e}") from None
    return version


def host_warnings(cfg: Config) -> list[str]:
    """What would stop `serve` on this host but may be fine where it runs: the directory of an
    ipc endpoint it binds ({runtime_dir} is created on demand; an explicit path is not)."""
    out = []
    for name, endpoint, binds in config_endpoints(cfg):
        path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None
        if binds and path and not path.startswith("@"):
            parent = os.path.dirname(path) or "."
            if not os.path.isdir(parent):
                out.append(f"{name} {endpoint}: directory {parent} does not exist on this host (serve would "
                           "refuse to bind it)")
    return out
