"""Benchmarks and the model factory they run on (imported from the repo root, not installed)."""
