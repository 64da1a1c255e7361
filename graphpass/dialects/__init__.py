"""What differs per format: the Dialect protocol and the TF and ONNX dialects."""
