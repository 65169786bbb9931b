"""Bundled models: default.onnx is what `onnxep run` runs when no model is given."""
