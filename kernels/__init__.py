"""Installed as hft_infer.kernels."""
