"""Errors a user can fix, defined in a leaf so that every layer can raise them.

The command line (hft_infer.app.cli) prints any of these as one line and exits
with code 2; everything else is a bug and prints a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad arguments, files or environment: the message is one line saying what to change."""


class ConfigError(UserError, ValueError):
    """A configuration the service cannot run with; the message is one line naming the field."""
