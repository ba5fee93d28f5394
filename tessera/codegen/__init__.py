"""Code generation: each plan kernel as generated Triton, a torch call, both, or a GEMM template (see select.py)."""
