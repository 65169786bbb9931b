"""Executing a plan: the loop over its steps, the straight-line code, output aliasing."""
