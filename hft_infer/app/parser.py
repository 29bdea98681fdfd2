"""Every command's arguments, with argparse alone (no numpy, zmq or torch), so that
`hft-infer --help` and `hft-infer COMMAND --help` stay fast.

`COMMANDS` maps a subcommand to its help line, the function here that adds its
arguments, and the `hft_infer.app` module whose `main(args)` runs it
(imported by `cli` only when that command runs).
"""

from __future__ import annotations

import argparse


def add_config_args(p: argparse.ArgumentParser, *, required: bool = False, help_text: str | None = None) -> None:
    p.add_argument("-c", "--config", required=required, metavar="FILE",
                   help=help_text or "TOML config (default: the embedded configs/default.toml; builtin:NAME for "
                                     "others)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (TOML syntax; repeatable), e.g. --set scheduler.policy=window")


class _TransportAction(argparse.Action):
    """`--transport T`: the same as `--set ingest.transport=T --set egress.transport=T`."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        overrides = list(getattr(namespace, "overrides", None) or [])
        namespace.overrides = overrides + [f"ingest.transport={values}", f"egress.transport={values}"]


def add_transport_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transport", choices=("zmq", "iceoryx2"), action=_TransportAction, default=None,
                   help="feed and decisions over ZeroMQ or iceoryx2 shared memory (the shm extra); the same as "
                        "--set ingest.transport=T --set egress.transport=T (default: the config's)")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run the inference service: ingest, schedule, step, publish. On SIGTERM/SIGINT it "
                     "drains, prints the latency table and exits 0.")
    add_config_args(p)
    add_transport_argument(p)
    p.add_argument("--shard", metavar="I/N",
                   help="serve only shard I of N (instrument position %% N == I, or universe.shard_weights' plan)")
    p.add_argument("--run-dir", metavar="DIR", help="where to write summary JSON and histograms")
    p.add_argument("--no-control", action="store_true", help="do not start the control process (dashboard)")
    p.add_argument("--json", metavar="PATH", help="also write the final summary JSON here")


def add_harness_arguments(p: argparse.ArgumentParser) -> None:
    """The load generator's options, shared by bench and replay."""
    add_transport_argument(p)
    p.add_argument("--pacer", choices=("auto", "spin", "sleep"), default="auto",
                   help="spin: hit send times by spinning on a core of its own (accurate); sleep: sleep through "
                        "every wait (for machines with too few cores to give the service, the pacer, the "
                        "collector and their I/O threads one each); auto (default): spin with 4 or more cores, "
                        "else sleep")
    p.add_argument("--collectors", type=int, default=1, metavar="N",
                   help="decision collector processes (default 1); more split the per-instrument topics "
                        "between them, for services that publish one Decision per event at high rates")
    floor = p.add_mutually_exclusive_group()
    floor.add_argument("--null-service", action="store_true",
                       help="measure the harness floor: a null service that answers every event at once "
                            "(same sockets, framing and placement, no model) instead of the service")
    floor.add_argument("--with-floor", action="store_true",
                       help="run the null service first, then the service, with the same feed and harness; "
                            "print both tables and their ratio")
    p.add_argument("--feed-batch", type=int, default=1, metavar="N",
                   help="when several events are due at once (the pacer fell behind: at high rates, or sleeping), "
                        "send up to N of them as one EventBatch frame (default 1: one event per frame, as a feed "
                        "of single quotes); capped so that a frame fits the service's ingest.max_batch_frame_bytes")
    p.add_argument("--null-egress", choices=("batch", "per_instrument"), default="batch",
                   help="the null service answers a burst with one DecisionBatch (default) or one Decision "
                        "per event on its instrument's topic")
    p.add_argument("--null-delay-us", type=float, default=0.0, metavar="US",
                   help="the null service holds each answer this long (calibration: tick-to-decision must "
                        "then read this plus the floor)")


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Start the service as a subprocess, offer open-loop synthetic load at --rate events/s and "
                     "print per-stage and tick-to-decision percentiles and the accounting.")
    add_config_args(p)
    p.add_argument("--rate", type=float, default=20_000, help="offered events/s (default 20000)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load (default 10)")
    p.add_argument("--instruments", type=int, default=None, help="instruments in the feed (default: universe size)")
    p.add_argument("--poisson", action="store_true", help="Poisson arrivals instead of a constant rate")
    p.add_argument("--warmup", type=float, default=1.0,
                   help="seconds of load before measuring (default 1): those events are sent and accounted "
                        "for, and left out of the latency figures")
    p.add_argument("--json", metavar="PATH", help="write the result JSON here")
    p.add_argument("--run-dir", metavar="DIR", help="keep the service's histograms and logs here")
    p.add_argument("--seed", type=int, default=1)
    add_harness_arguments(p)
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="run N services on the one feed, as `serve --shard I/N` (each on the core that its [cpu] "
                        "placement gives slot I, its endpoints named <service.name>-sI); print a table per shard "
                        "and for all of them together. Over iceoryx2 (--transport) each shard has its own feed and "
                        "decision services, which needs --feed-batch > 1")
    p.add_argument("--shard-collectors", type=int, default=None, metavar="K",
                   help="with --shards: decision collector processes, each serving N/K shards (default: as many "
                        "as get a core of their own, dividing N, while two cores stay for the I/O threads; 1 on small "
                        "machines)")
    p.add_argument("--balance-shards", action="store_true",
                   help="with --shards: split the instruments by the feed's own event counts (universe.shard_weights) "
                        "so that every shard gets about the same events/s, instead of instrument position %% N")
    p.add_argument("--quiet", action="store_true", help="no live progress display")


def add_check_config_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "Print the resolved config; a bad file gives one line naming the field and exit code 2."
    p.add_argument("file", nargs="?", default=None, help="TOML file (default: the embedded default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replay market data through a service, open loop, and account for every event. SOURCE is "
        "'synthetic', LOBSTER message/orderbook CSV files or folders, or a capture file from "
        "`hft-infer record`. By default the service named by the config must be running (replay binds "
        "its feed endpoint); --start-service runs one as a child instead.")
    add_source_arguments(parser)
    parser.add_argument("-c", "--config", metavar="FILE",
                        help="the service's config: endpoints, universe, model for --verify (default: embedded)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, metavar="X",
                      help="original timestamps scaled by 1/X (default for LOBSTER and captures: 1)")
    pace.add_argument("--rate", type=float, metavar="R", help="a fixed rate, events/s (default for synthetic: 20000)")
    pace.add_argument("--max", action="store_true", help="as fast as possible")
    parser.add_argument("--poisson", action="store_true", help="with --rate: Poisson arrivals")
    parser.add_argument("--events", type=int, default=200_000, help="synthetic: number of events (default 200000)")
    parser.add_argument("--instruments", type=int, default=None, help="synthetic: instruments (default: universe)")
    parser.add_argument("--seed", type=int, default=1, help="synthetic: seed")
    parser.add_argument("--levels", type=int, default=None, help="book levels to send (default: the model's)")
    parser.add_argument("--strict", action="store_true", help="LOBSTER: a malformed line is fatal")
    parser.add_argument("--instrument-ids", metavar="IDS", help="LOBSTER: '3,4' by file or 'AAPL=3,MSFT=4' by ticker")
    parser.add_argument("--verify", action="store_true",
                        help="compare every decision with the model's offline reference; exit 1 on a mismatch")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="--verify: max |score difference| (default: what the config's runner.precision "
                             "allows: fp32 1e-4, tf32 5e-3, bf16 3e-2)")
    parser.add_argument("--show-mismatches", type=int, default=10, metavar="N")
    parser.add_argument("--start-service", action="store_true",
                        help="run `hft-infer serve` with this config as a child for the replay")
    add_harness_arguments(parser)
    parser.add_argument("--json", metavar="PATH", help="write the result JSON (bench schema) here")
    parser.add_argument("--run-dir", metavar="DIR", help="where to write summary.json and histograms")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress display and no list of skipped lines (their count is still printed)")


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Record a live feed, byte for byte, into a capture file. By default it subscribes to "
                          "the feed the config's service reads (ingest.endpoint).")
    add_config_args(parser, help_text="config whose ingest.endpoint is recorded when --endpoint is not given "
                                      "(default: the embedded default)")
    parser.add_argument("--endpoint", metavar="E",
                        help="feed to record, e.g. ipc:///run/hft-infer/hft-infer-md.sock, tcp://127.0.0.1:5555 or "
                             "iceoryx2:SERVICE (default: the config's ingest.endpoint, or ingest.shm_service)")
    add_transport_argument(parser)
    parser.add_argument("--out", required=True, metavar="FILE", help="capture file to write")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="stop after S seconds (default: until SIGINT/SIGTERM or --count)")
    parser.add_argument("--count", type=int, default=None, metavar="N", help="stop after N messages")
    parser.add_argument("--socket-type", choices=("sub", "pull"), default="sub",
                        help="sub: subscribe to a PUB feed (default); pull: receive from PUSH publishers")
    parser.add_argument("--bind", action="store_true",
                        help="bind the endpoint instead of connecting (publishers connect to the recorder)")
    parser.add_argument("--instrument", type=int, action="append", default=None, metavar="ID",
                        help="record only this instrument's topic (repeatable; SUB only; default: everything)")
    parser.add_argument("--no-topic-frame", action="store_true",
                        help="mark the capture as single-frame messages (informational; frames are stored as received)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="permit a non-loopback tcp endpoint without CURVE (as security.allow_remote)")
    parser.add_argument("--flush-ms", type=float, default=None, metavar="MS",
                        help="write a block at least this often while messages are pending (default 200)")
    parser.add_argument("--flush-records", type=int, default=None, metavar="N",
                        help="write a block every N messages (default 4096)")
    parser.add_argument("--fsync", action="store_true", help="fsync every block (survives power loss; slower)")
    parser.add_argument("--warn-silent-after", type=float, default=5.0, metavar="S",
                        help="warn once if no message arrived within S seconds (default 5; 0 = never)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--force", action="store_true", help="overwrite an existing file")
    group.add_argument("--append", action="store_true",
                       help="append to an existing capture (a torn tail from a crash is cut first)")


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="RUN_DIR_OR_HLOG",
                   help="run directories (serve/bench/replay/dashboard), .hlog or .hgrm files; one run each")
    p.add_argument("--out", default="report.html", metavar="HTML", help="HTML file to write (default report.html)")
    p.add_argument("--png", metavar="PNG", help="PNG of the figure (default: the HTML's name with .png)")
    p.add_argument("--no-png", action="store_true", help="write only the HTML")
    p.add_argument("--label", action="append", default=[], metavar="NAME",
                   help="name of each run in the order given (default: directory or file names)")
    p.add_argument("--title", default="hft-infer latency report", help="heading of the page and the figure")


def add_dashboard_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", metavar="FILE",
                   help="TOML config (default: the embedded default); supplies the endpoint, host, port")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
    p.add_argument("--connect", metavar="ENDPOINT",
                   help="control endpoint the service ships snapshots to; this process binds it "
                        "(default: metrics.control_endpoint)")
    p.add_argument("--host", help="dashboard bind address (default: control.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="dashboard port, 0 = any free one (default: control.port)")
    p.add_argument("--run-dir", metavar="DIR",
                   help="where service.hlog, <stage>.hgrm and dashboard.url go "
                        "(default: service.run_dir, else ./runs/<name>-dashboard-<time>)")
    p.add_argument("--no-hlog", action="store_true", help="do not write the .hlog interval log")
    p.add_argument("--history-points", type=int, default=600, metavar="N",
                   help="points of percentile history kept and plotted (default 600: 10 min at 1 s)")


def add_systemd_unit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print a systemd unit for a config: Type=notify with watchdog, restart on failure, CPU/NUMA "
        "placement from [cpu], resource limits and sandboxing. Install it under /etc/systemd/system/.")
    parser.add_argument("-c", "--config", required=True, metavar="FILE",
                        help="the TOML config the service will run (its absolute path goes into ExecStart)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="config override, applied here and passed on to ExecStart (repeatable)")
    parser.add_argument("--instance", metavar="NAME",
                        help="unit hft-infer@NAME.service (overrides the template for that instance)")
    parser.add_argument("--drop-in", action="store_true",
                        help="with --instance: print only the config-specific drop-in for the template")
    parser.add_argument("--shard", metavar="I/N", help="pass --shard I/N to serve (also picks the auto core)")
    parser.add_argument("--user", default="hft-infer", help="User= (default: hft-infer, a dedicated system user)")
    parser.add_argument("--group", default=None, help="Group= (default: the user's name)")
    parser.add_argument("--exec", dest="exec_path", metavar="PATH",
                        help="the hft-infer executable (default: the one installed beside this Python)")


def add_keys_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    p = sub.add_parser("generate", help="create NAME.key (public) and NAME.key_secret (0600) in DIR",
                       description="Create a CURVE key pair: DIR/NAME.key (public: give it to peers) and "
                                   "DIR/NAME.key_secret (mode 0600). Existing files are never overwritten.")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--name", default="hft-infer", help="file name stem (default: hft-infer)")
    p = sub.add_parser("show", help="print a key file's public key and check its permissions")
    p.add_argument("file", metavar="FILE")
    p = sub.add_parser("check", help="check a config's security settings and key files",
                       description="Load the keys a config names, list the authorized clients, and print "
                                   "warnings (world-readable secrets, endpoints in clear). Exit 2 on a refusal.")
    p.add_argument("-c", "--config", metavar="FILE", help="TOML config (default: the embedded default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")


TRAIN_SYNTHETIC_EVENTS = 150_000
TRAIN_SYNTHETIC_SEED = 101
TRAIN_HELDOUT_EVENTS = 100_000
TRAIN_HELDOUT_SEED = 202


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """SOURCE... and --source, as replay and train read market data."""
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="'synthetic', LOBSTER message/orderbook files or folders, or a capture file (.cap)")
    p.add_argument("--source", choices=("auto", "synthetic", "lobster", "capture"), default="auto",
                   help="source kind (default: from the names)")


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Train a built-in model (a preset or a spec) on LOBSTER files, a capture file or synthetic "
                     "data; write a .safetensors checkpoint and print held-out accuracy/AUC against naive "
                     "predictors.")
    add_source_arguments(p)
    p.add_argument("--out", required=True, metavar="FILE", help="checkpoint to write (.safetensors)")
    model = p.add_mutually_exclusive_group()
    model.add_argument("--preset", default=None, help="model preset (default mlp_small)")
    model.add_argument("--spec", metavar="JSON", help="model spec as JSON, e.g. '{\"kind\": \"mlp\", \"window\": 16, "
                                                      "\"hidden\": [64]}' (fields of models.spec.ModelSpec)")
    p.add_argument("--version", default="trained-1", help="producer's label in the header (default trained-1)")
    p.add_argument("--horizon", type=int, default=10, help="label: mid move over the next N events (default 10)")
    p.add_argument("--dead-zone-ticks", type=float, default=0.5, help="|move| <= this many ticks is flat (0.5)")
    p.add_argument("--tick", type=float, default=None, help="price tick (default: synthetic's, else 0.01)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (one-cycle)")
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=7, help="model init and shuffling")
    p.add_argument("--threads", type=int, default=1, help="torch threads while training (part of the result)")
    p.add_argument("--events", type=int, default=TRAIN_SYNTHETIC_EVENTS, help=f"synthetic: training events "
                   f"({TRAIN_SYNTHETIC_EVENTS})")
    p.add_argument("--data-seed", type=int, default=TRAIN_SYNTHETIC_SEED,
                   help=f"synthetic: seed ({TRAIN_SYNTHETIC_SEED})")
    p.add_argument("--heldout-events", type=int, default=TRAIN_HELDOUT_EVENTS,
                   help=f"synthetic: held-out events ({TRAIN_HELDOUT_EVENTS})")
    p.add_argument("--heldout-seed", type=int, default=TRAIN_HELDOUT_SEED,
                   help=f"synthetic: held-out seed ({TRAIN_HELDOUT_SEED})")
    p.add_argument("--heldout-fraction", type=float, default=0.2,
                   help="files: the last fraction of events (in time) held out (default 0.2)")
    p.add_argument("--instrument-ids", metavar="IDS", help="LOBSTER: '3,4' by file or 'AAPL=3,MSFT=4' by ticker")
    p.add_argument("--strict", action="store_true", help="LOBSTER: a malformed line is fatal")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_shard_plan_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Count each configured instrument's events in recorded (or synthetic) market data and "
                     "show how N shards would split them: by instrument position (serve --shard I/N's default) "
                     "and balanced by those counts (universe.shard_weights, printed for every shard's config).")
    add_source_arguments(p)
    add_config_args(p, help_text="the shards' config: its universe (default: the embedded default)")
    p.add_argument("--shards", type=int, required=True, metavar="N", help="number of shards")
    p.add_argument("--out", metavar="FILE", help="write the [universe] shard_weights line here instead of stdout")
    p.add_argument("--events", type=int, default=200_000, help="synthetic: number of events (default 200000)")
    p.add_argument("--seed", type=int, default=1, help="synthetic: seed (default 1, as bench)")
    p.add_argument("--instrument-ids", metavar="IDS", help="LOBSTER: '3,4' by file or 'AAPL=3,MSFT=4' by ticker")
    p.add_argument("--strict", action="store_true", help="LOBSTER: a malformed line is fatal")


COMMANDS: dict[str, tuple[str, object, str]] = {
    # name: (help, argument builder, module under hft_infer.app with main(args))
    "serve": ("run the service until SIGINT/SIGTERM", add_serve_arguments, "serve"),
    "bench": ("the main job: service + open-loop synthetic load + latency table", add_bench_arguments, "bench"),
    "replay": ("replay recorded or synthetic market data through a service", add_replay_arguments, "replay_cmd"),
    "record": ("record a live feed into a capture file", add_record_arguments, "record_cmd"),
    "report": ("HTML/PNG latency report comparing runs", add_report_arguments, "report"),
    "dashboard": ("run the control process (dashboard, /metrics, HDR logs) on its own", add_dashboard_arguments,
                  "dashboard"),
    "check-config": ("validate a config and print it resolved", add_check_config_arguments, "check_config"),
    "systemd-unit": ("print a systemd unit for a config", add_systemd_unit_arguments, "systemd"),
    "shard-plan": ("balance shards by recorded activity: universe.shard_weights from a capture",
                   add_shard_plan_arguments, "shard_plan"),
    "keys": ("CURVE key management (generate, show, check)", add_keys_arguments, "keys"),
    "train": ("train a model on LOBSTER, capture or synthetic data into a checkpoint", add_train_arguments,
              "train_cmd"),
}
