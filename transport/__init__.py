"""Wire schema, codecs and ZeroMQ sockets (installed as `hft_infer.transport`).

Uses nothing else of the project, so foreign clients can import it alone.
"""
