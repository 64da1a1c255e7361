from setuptools import find_packages, setup

setup(
    name="graphpass",
    version="0.1.0",
    description="Graph rewrites (rematerialization, stale-gradient dropping) for exported "
    "TensorFlow and ONNX training graphs",
    packages=find_packages(include=["graphpass", "graphpass.*"]),
    python_requires=">=3.10",
    install_requires=[
        "tensorflow-cpu>=2.21,<2.22",
        "onnx>=1.16",
        "onnxruntime>=1.18",
        "networkx>=3.0",
        "numpy>=1.26",
        "matplotlib>=3.7",
        "tomli>=2.0; python_version<'3.11'",
    ],
    # tf-keras builds the Keras test/benchmark models (tools/keras_models.py); install it
    # with `pip install --no-deps tf-keras` so that it does not replace tensorflow-cpu.
    extras_require={"test": ["pytest>=8", "ruff", "tf-keras>=2.16,<2.22"]},
    entry_points={"console_scripts": ["graphpass=graphpass.cli:entry_point"]},
)
