"""Code generation: each plan kernel as generated Triton, a torch call, or both (see select.py)."""
