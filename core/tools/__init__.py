"""Tooling on top of the runtime: the CLI, conformance, parity, the benchmark, pytest."""
