"""`hft-infer check-config`: validate a config and print it resolved."""

from __future__ import annotations

import argparse

from hft_infer.config import dump_toml, load_config


def main(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.overrides)
    print(dump_toml(cfg), end="")
    return 0
