"""Decoding with a model's state kept where it runs: the decoder's inputs, the greedy loop."""
