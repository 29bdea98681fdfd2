"""The application layer: the `hft-infer` command line and every command.

May use every other layer (service core, replay, transport, kernels); nothing
outside `app` imports it. `cli` dispatches to one command module per
subcommand (imported only when that command runs); `parser` defines every
command's arguments with argparse alone, so `--help` stays fast.
"""
