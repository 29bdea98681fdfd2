"""Installed as hft_infer.configs."""
