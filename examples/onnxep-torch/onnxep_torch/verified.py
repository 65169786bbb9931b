"""Generic-library ops the torch provider claims: each passes every node-suite case it runs.

Filled in from ``backend_suite(["torch"])`` runs with option
``unverified = true``. Torch-native kernels (``NATIVE``) are always claimed.
"""

NATIVE: frozenset[tuple[str, str]] = frozenset(
    {("", "MatMul"), ("", "Conv"), ("", "Softmax")}
)

VERIFIED: frozenset[tuple[str, str]] = frozenset()
