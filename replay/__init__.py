"""Installed as hft_infer.replay."""
