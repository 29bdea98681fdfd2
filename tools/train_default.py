#!/usr/bin/env python3
"""Train the default model shipped in the package (hft_infer/models/weights/default.safetensors).

A thin wrapper of `hft-infer train` (hft_infer/app/train_cmd.py) with the default recipe:

    python tools/train_default.py                   # writes the shipped weights, prints the metrics
    python tools/train_default.py --out /tmp/x.safetensors

is exactly

    hft-infer train synthetic --version default-2 --out hft_infer/models/weights/default.safetensors

(mlp_small, 150k synthetic events of seed 101, held out 100k of seed 202, horizon 10,
3 epochs, one thread; ~10 s on the 2-core VM). tests/unit/test_train.py retrains it and
checks that the shipped file is what the command writes, byte for byte.
"""

from __future__ import annotations

import sys

from hft_infer.app.cli import main as cli_main
from hft_infer.app.train_cmd import DEFAULT_COMMAND
from hft_infer.models.checkpoint import builtin_path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--out" not in argv:
        argv += ["--out", str(builtin_path("default"))]
    return cli_main(["train", *DEFAULT_COMMAND, *argv])


if __name__ == "__main__":
    sys.exit(main())
