"""The CuPy provider (``cuda``). Importable without CuPy; unavailable, with the reason, until then.

Submodules that need CuPy (``provider``, ``blas``, ``elementwise``, the op
modules) import it when a session asks for ``cuda``; ``plugin``,
``availability``, ``options`` and ``declines`` never do.
"""
