"""Format detection, atomic output, and the TF and ONNX readers/writers."""
