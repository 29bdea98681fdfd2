"""The control plane: everything about watching the service, in its own process.

- protocol.py: the Snapshot the hot loop ships once per stats interval;
- process.py: `hft-infer dashboard`, and start/stop helpers for `serve`;
- server.py: the running process (ZeroMQ PULL in, uvloop, aiohttp out);
- aggregator.py: interval and cumulative histograms, rates, bounded history;
- dashboard.py + static/: the page, its WebSocket feed, /metrics;
- exporter.py: the Prometheus collector;
- hlog.py, histograms.py: .hlog/.hgrm files and vectorised HDR percentiles;
- report.py: `hft-infer report` (HTML + PNG comparison of runs);
- feeder.py: synthetic snapshots over a real socket, for tests and demos.

docs/notes/observability.md describes how the pieces fit and fail.
"""
