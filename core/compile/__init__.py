"""Compiling: a graph partitioned among the providers, planned once into steps."""
