from setuptools import find_packages, setup

# The runtimes are extras, found by import name at run time: `tf` or `tf-cpu` for
# TensorFlow graphs, `onnx` for ONNX models (onnxruntime-training, which provides the
# same `onnxruntime` module, serves instead of onnxruntime when installed beside
# `pip install graphpass onnx`). No extra may depend on TensorFlow in another way:
# a second TensorFlow distribution would be written over the first, so `test` leaves
# tf-keras and keras-hub out (the Keras fixtures need them: `pip install --no-deps
# tf-keras keras-hub`; keras-hub depends on tensorflow-text, which depends on
# tensorflow); `test` holds what keras-hub imports.
# `onnx` has sympy: onnxruntime's symbolic shape inference, which sizes its own
# ops (`com.microsoft`), imports it; onnxruntime lists it only under an extra.
TF = ">=2.21,<2.22"

setup(
    name="graphpass",
    version="0.1.0",
    description="Graph rewrites (rematerialization, stale-gradient dropping) for exported "
    "TensorFlow and ONNX training graphs",
    packages=find_packages(include=["graphpass", "graphpass.*"]),
    python_requires=">=3.10",
    install_requires=[
        "networkx>=3.0",
        "numpy>=1.26",
        "matplotlib>=3.7",  # --memory-plot and --dump-dir's memory.svg
        "google-re2>=1.1",  # --recompute patterns: linear-time matching of any pattern
        "tomli>=2.0; python_version<'3.11'",
    ],
    extras_require={
        "tf": [f"tensorflow{TF}"],
        "tf-cpu": [f"tensorflow-cpu{TF}"],
        "onnx": ["onnx>=1.16", "onnxruntime>=1.18", "sympy>=1.12"],
        "test": ["pytest>=8", "pytest-xdist>=3.5", "ruff", "regex", "rich", "absl-py",
                 "tokenizers"],
    },
    entry_points={"console_scripts": ["graphpass=graphpass.cli:entry_point"]},
)
