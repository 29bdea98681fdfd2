"""systemd's notify protocol (sd_notify(3)), in a few lines and without a dependency.

The protocol: newline-separated `KEY=VALUE` assignments in one datagram to
the AF_UNIX socket named by `$NOTIFY_SOCKET` (a path, or `@name` for the
abstract namespace). systemd identifies the sender by the datagram's
credentials (with `NotifyAccess=main`, only the main PID is heard), so no
handshake is needed. The service sends:

- `READY=1` once warm-up and graph capture are done (`Type=notify`: until
  then `systemctl start` waits and dependents do not start);
- `WATCHDOG=1` from the hot loop's housekeeping, at least every
  `watchdog_interval_s()`: a wedged loop stops pinging and systemd kills and
  restarts it (`WatchdogSec=`, `Restart=on-failure`);
- `STOPPING=1` when SIGTERM arrives, while it drains;
- `STATUS=...` free text, shown by `systemctl status`;
- `EXTEND_TIMEOUT_USEC=...` before warm-up and graph capture (a cold Triton
  compile can take minutes): `serve` asks for `service.start_timeout_s`
  more, counted from then, so a slow first start is not killed as hung.

Sends are non-blocking and never raise: the socket is `O_NONBLOCK`, so a full
receive queue (systemd busy) drops the datagram and counts it rather than
stall the hot loop. Without `$NOTIFY_SOCKET` (not under systemd, or
`Type=simple`) every call is a no-op.
"""

from __future__ import annotations

import os
import socket


def _address(value: str) -> str | bytes | None:
    if value.startswith("@"):
        return b"\0" + value[1:].encode()  # abstract namespace
    if value.startswith("/"):
        return value
    return None  # vsock:... (systemd >= 253 in VMs) is not supported here


class Notifier:
    """Talks to systemd over $NOTIFY_SOCKET; a no-op when there is none.

    `sent`, `dropped` (receiver's queue full) and `failed` (any other error)
    count datagrams, for the service's own counters.
    """

    def __init__(self, notify_socket: str | None) -> None:
        self.address = _address(notify_socket) if notify_socket else None
        self.unsupported = bool(notify_socket) and self.address is None
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self.last_error: str | None = None
        self._sock: socket.socket | None = None
        if self.address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)

    @classmethod
    def from_env(cls, *, unset_environment: bool = False) -> Notifier:
        """From $NOTIFY_SOCKET. unset_environment removes it (and the watchdog
        variables) so that child processes (the control process) do not
        notify in our name."""
        value = os.environ.get("NOTIFY_SOCKET")
        if unset_environment:
            for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
                os.environ.pop(key, None)
        return cls(value)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, *assignments: str) -> bool:
        """Send KEY=VALUE lines in one datagram; True if the kernel took it."""
        if self._sock is None:
            return False
        try:
            self._sock.sendto("\n".join(assignments).encode(), self.address)
        except BlockingIOError:
            self.dropped += 1
            return False
        except OSError as e:  # systemd gone or socket removed: never the loop's problem
            self.failed += 1
            self.last_error = f"{e.strerror or e}"
            return False
        self.sent += 1
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={_one_line(text)}")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for `seconds` more before systemd times out the current start or stop."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _one_line(text: str) -> str:
    return " ".join(text.split())  # a newline would start a new assignment


def watchdog_interval_s(environ: dict[str, str] | None = None) -> float | None:
    """How often to send WATCHDOG=1, in seconds: half of $WATCHDOG_USEC (sd_watchdog_enabled's
    advice), or None when the watchdog is off or meant for another process ($WATCHDOG_PID)."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1_000_000 if value > 0 else None
