"""Loading: a model read from a path, bytes or a proto, checked, and made an onnx-ir model."""
