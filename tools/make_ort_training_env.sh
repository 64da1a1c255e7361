#!/usr/bin/env bash
# Build .venv-ort-training/: a second virtualenv for the ONNX Runtime on-device
# training tests (tests marked `ort_training`). onnxruntime-training-cpu 1.19.2 reads
# IR version <= 10 and is built against numpy 1, so it cannot share the main
# environment (newer onnx and numpy); both builds install the same `onnxruntime`
# module, so it cannot share it with onnxruntime either.
# Usage: tools/make_ort_training_env.sh [VENV_DIR]   (default: .venv-ort-training)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-ort-training}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# The producer versions the test artifacts were generated with (tools/fixtures/ort_artifacts.py
# records them); torch's CPU wheel keeps the environment free of CUDA libraries;
# transformers builds the tutorial's GPT-2 (tools/fixtures/ort_tutorial.py).
"$VENV/bin/python" -m pip install -q -e '.[test]' \
  'onnxruntime-training-cpu==1.19.2' 'onnx==1.16.2' 'numpy<2' \
  "${ORT_TRAINING_TORCH:-torch==2.13.0+cpu}" 'transformers==5.25.0'
"$VENV/bin/python" -c "import onnxruntime.training.api, onnx, torch, transformers; \
print('ort-training env:', onnx.__version__, torch.__version__, transformers.__version__)"
