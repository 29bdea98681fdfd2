"""Security policy: which endpoints get CURVE, the ZAP authenticator, key-file checks.

Policy (DESIGN.md, Operations):
- ipc:// and loopback tcp stay plain: file permissions (ipc) and the host
  boundary protect them, and CURVE would add microseconds per message.
- A non-loopback endpoint uses CURVE when keys are configured; without keys
  it is refused unless `security.allow_remote = true` (explicit opt-out:
  traffic in clear, anyone who can reach the port may connect).
- `security.curve_loopback = true` gives loopback tcp endpoints CURVE too
  (when keys are configured): a rig on one machine whose 127.0.0.1 ports
  stand for other hosts (tests/integration/test_shards_hosts.py), or a host
  whose other local users are not trusted. ipc stays plain.
- This service has one key pair (`security.curve_server_secret`). It is the
  CURVE server on the egress socket (whichever side binds: CURVE roles are
  independent of bind/connect) and on a binding ingest socket; on a
  connecting ingest socket it is the client of the feed
  (`security.curve_feed_public`), and the feed must list its public key.
- A CURVE server socket admits only the clients whose public keys are in
  `security.curve_authorized_dir` (ZAP authenticator, transport.curve).
- The dashboard binds loopback unless allow_remote; it serves nothing writable.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hft_infer.config import expand_endpoint
from hft_infer.errors import ConfigError
from hft_infer.transport.curve import (
    CurveKeyError,
    ZapAuthenticator,
    load_authorized_keys,
    load_client_keys,
    load_server_keys,
)
from hft_infer.transport.sockets import EndpointError, is_local_endpoint, parse_endpoint


def _config_error(msg: str) -> Exception:
    return ConfigError(msg)


def _is_local(endpoint: str) -> bool:
    try:
        return is_local_endpoint(endpoint)
    except EndpointError as e:
        raise _config_error(str(e)) from None


def _plain(cfg, endpoint: str) -> bool:
    """True: this endpoint goes without CURVE (ipc, inproc; loopback tcp unless curve_loopback)."""
    if not _is_local(endpoint):
        return False
    return not (cfg.security.curve_loopback and endpoint.startswith("tcp://"))


def _load(what: str, loader, *paths):
    try:
        return loader(*paths)
    except CurveKeyError as e:
        raise _config_error(f"{what}: {e}") from None


def _client_secret(cfg) -> str:
    # A separate client identity is optional (proposed field); default: the service's own key pair.
    return getattr(cfg.security, "curve_client_secret", "") or cfg.security.curve_server_secret


def curve_for_egress(cfg):
    """CurveServer for the decision socket when its endpoint is non-loopback and keys are set;
    None otherwise (the socket factory then refuses a remote endpoint unless allow_remote)."""
    sec = cfg.security
    if _plain(cfg, cfg.egress.endpoint) or not sec.curve_server_secret:
        return None
    return _load("security.curve_server_secret", load_server_keys, sec.curve_server_secret)


def curve_for_ingest(cfg):
    """CURVE for the market-data socket on a non-loopback endpoint:
    binding -> CurveServer (publishers connect as clients with our public key);
    connecting -> CurveClient of the feed (needs security.curve_feed_public)."""
    sec = cfg.security
    if _plain(cfg, cfg.ingest.endpoint):
        return None
    if cfg.ingest.bind:
        if not sec.curve_server_secret:
            return None
        return _load("security.curve_server_secret", load_server_keys, sec.curve_server_secret)
    if not sec.curve_feed_public:
        if sec.curve_server_secret and not sec.allow_remote:
            raise _config_error(
                f"ingest.endpoint {cfg.ingest.endpoint} takes CURVE: set security.curve_feed_public "
                "(the feed's public key) or security.allow_remote = true")
        return None
    secret = _client_secret(cfg)
    if not secret:
        raise _config_error("security.curve_feed_public needs security.curve_server_secret "
                            "(this service's key pair, its identity towards the feed)")
    return _load("security.curve_feed_public", load_client_keys, secret, sec.curve_feed_public)


def serves_curve(cfg) -> bool:
    sec = cfg.security
    if not sec.curve_server_secret:
        return False
    return (not _plain(cfg, cfg.egress.endpoint)) or (cfg.ingest.bind and not _plain(cfg, cfg.ingest.endpoint))


def start_authenticator(ctx, cfg):
    """Start the ZAP authenticator on `ctx` when this config makes any CURVE server socket.

    Call before binding those sockets (and before pinning the hot thread, or
    let affinity.finish_warmup move its thread). Returns the authenticator
    (stop it after closing the sockets) or None."""
    if not serves_curve(cfg):
        return None
    directory = cfg.security.curve_authorized_dir
    if not directory:
        raise _config_error("security.curve_authorized_dir is required with CURVE: without it any client "
                            "that knows the server's public key could connect")
    try:
        return ZapAuthenticator(ctx, directory).start()
    except CurveKeyError as e:
        raise _config_error(f"security.curve_authorized_dir: {e}") from None


def config_endpoints(cfg) -> list[tuple[str, str, bool]]:
    """(field, endpoint with {runtime_dir} and {name} filled in, binds?) of every socket `serve` opens."""
    return [("ingest.endpoint", expand_endpoint(cfg.ingest.endpoint, cfg), cfg.ingest.bind),
            ("egress.endpoint", expand_endpoint(cfg.egress.endpoint, cfg), cfg.egress.bind),
            # the service connects its PUSH; the control process binds
            ("metrics.control_endpoint", expand_endpoint(cfg.metrics.control_endpoint, cfg), False)]


def check_endpoints(cfg) -> None:
    """ConfigError naming the field for an endpoint that `serve` could not open (malformed)."""
    for name, endpoint, binds in config_endpoints(cfg):
        try:
            parse_endpoint(endpoint, bind=binds)
        except EndpointError as e:
            raise _config_error(f"{name}: {e}") from None


def check_security(cfg) -> list[str]:
    """Pre-flight at start: raise ConfigError for a configuration `serve` refuses (a malformed
    endpoint, a non-loopback one without CURVE or allow_remote, CURVE without an authorized
    directory, a remote dashboard); return warnings for risky-but-allowed ones."""
    sec = cfg.security
    warnings: list[str] = []
    check_endpoints(cfg)
    remote = [(name, ep) for name, ep in (("ingest.endpoint", cfg.ingest.endpoint),
                                          ("egress.endpoint", cfg.egress.endpoint))
              if not _is_local(ep)]
    for name, ep in remote:
        curve = curve_for_ingest(cfg) if name.startswith("ingest") else curve_for_egress(cfg)
        if curve is None and not sec.allow_remote:
            raise _config_error(f"{name} {ep} is not loopback: configure CURVE keys "
                                "(security.curve_server_secret) or set security.allow_remote = true")
        if curve is None:
            warnings.append(f"{name} {ep}: no CURVE (security.allow_remote): traffic in clear, "
                            "anyone who reaches the port may connect")
    if serves_curve(cfg):
        if not sec.curve_authorized_dir:
            raise _config_error("security.curve_authorized_dir is required with CURVE")
        keys = _load("security.curve_authorized_dir", load_authorized_keys, sec.curve_authorized_dir)
        if not keys:
            warnings.append(f"{sec.curve_authorized_dir}: no client keys (*.key): every CURVE client is denied")
    control = cfg.metrics.control_endpoint
    if not _is_local(control):  # the control channel is never encrypted (sockets.check_endpoint in the service)
        if not sec.allow_remote:
            raise _config_error(f"metrics.control_endpoint {control} is not loopback: the control channel has no "
                                "CURVE; keep it on ipc:// or 127.0.0.1, or set security.allow_remote = true")
        warnings.append(f"metrics.control_endpoint {control}: no CURVE (security.allow_remote): counters and "
                        "histograms in clear")
    host = cfg.control.host
    if cfg.control.enabled and not is_local_endpoint(f"tcp://{host}:0"):
        if not sec.allow_remote:
            raise _config_error(f"control.host {host} is not loopback: the dashboard has no authentication; "
                                "keep it on 127.0.0.1 (ssh -L) or set security.allow_remote = true")
        warnings.append(f"control.host {host}: dashboard and /metrics reachable from the network "
                        "(read-only, no authentication)")
    if sec.allow_remote and sec.curve_server_secret:
        warnings.append("security.allow_remote with CURVE keys: endpoints without keys fall back to clear text")
    return warnings + check_key_permissions(cfg)


def mode_problem(path: Path, secret: bool) -> str | None:
    try:
        st = path.stat()
    except OSError:
        return None  # missing files are reported by the loaders
    mode = stat.S_IMODE(st.st_mode)
    if secret and mode & 0o077:
        who = "world" if mode & 0o007 else "group"
        return f"{path}: secret key is {who}-readable (mode {mode:04o}): chmod 600 {path}"
    if not secret and mode & 0o022:
        who = "world" if mode & 0o002 else "group"
        return f"{path}: {who}-writable (mode {mode:04o}): anyone in it could substitute a key"
    if st.st_uid not in (0, os.geteuid()):
        return f"{path}: owned by uid {st.st_uid}, not by this user or root"
    return None


def check_key_permissions(cfg, config_path: str | None = None) -> list[str]:
    """Warnings for key files others could read or replace: a group/world-readable secret key,
    a group/world-writable authorized-keys directory or key, or config file."""
    sec = cfg.security
    out: list[str] = []
    for secret_path in {sec.curve_server_secret, _client_secret(cfg)} - {""}:
        p = Path(secret_path)
        out.append(mode_problem(p, secret=True))
        out.append(mode_problem(p.parent, secret=False))
    if sec.curve_feed_public:
        out.append(mode_problem(Path(sec.curve_feed_public), secret=False))
    if sec.curve_authorized_dir:
        d = Path(sec.curve_authorized_dir)
        out.append(mode_problem(d, secret=False))
        if d.is_dir():
            out.extend(mode_problem(p, secret=False) for p in sorted(d.glob("*.key")))
            out.extend(f"{p}: a secret key in the authorized-keys directory: move it out"
                       for p in sorted(d.glob("*.key_secret")))
    if config_path and not config_path.startswith("builtin:") and (
            sec.curve_server_secret or sec.curve_authorized_dir or sec.curve_feed_public):
        out.append(mode_problem(Path(config_path), secret=False))
    return [w for w in out if w]
