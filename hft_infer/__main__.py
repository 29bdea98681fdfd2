"""`python -m hft_infer ...` is the `hft-infer` command (child processes start it this way)."""

import sys

from hft_infer.app.cli import main

sys.exit(main())
