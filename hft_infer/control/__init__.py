"""The control plane: everything about watching the service, in its own process.

- settings.py: what the control process is told at start, the files it writes;
- process.py: start/stop helpers for `serve` (the command is hft_infer.app.dashboard);
- server.py: the running process (ZeroMQ PULL in, uvloop, aiohttp out);
- aggregator.py: interval and cumulative histograms, rates, bounded history;
- dashboard.py + static/: the page, its WebSocket feed, /metrics;
- exporter.py: the Prometheus collector.

The Snapshot it receives is a wire type (hft_infer.transport.stats); .hlog and
.hgrm files and HDR percentiles live in hft_infer.metrics.
docs/notes/observability.md describes how the pieces fit and fail.
"""
