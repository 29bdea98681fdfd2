"""Installed as hft_infer.kernels: fused Triton kernels of the model step, each with a
plain-torch reference (docs/notes/kernels.md).

    common       row transform, decision, grid barrier, precision switch (+ references)
    ring         ring scatter / window gather
    mlp          the whole window MLP in one launch
    lstm         the stacked-LSTM kernel, weight packing, workspace
    lstm_window  exact incremental window mode (one launch per step)
    lstm_stream  one recurrent step per event
    persistent   request ring in pinned memory, persistent life cycle, floor kernel
    lstm_persistent, mlp_persistent   persistent kernels behind the ring

Kept light: importing the package imports neither triton nor torch; import the
submodules (after setting TRITON_INTERPRET, for the CPU interpreter).
"""
