"""kernels.fused: memlab's own Triton kernels for the residual stream and the MLP (see forward.py)."""
