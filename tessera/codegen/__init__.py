"""Code generation: each plan kernel as generated Triton, a torch call, both, or a GEMM or convolution
template (see select.py)."""
