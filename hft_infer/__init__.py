"""hft-infer: microsecond-scale model inference on a ZeroMQ market-data stream."""

__version__ = "0.1.0"
