"""NumPy-specific kernels that override the generic library where NumPy does better."""
