"""The IR's dtype names as numpy dtypes.

Dialects name dtypes the way numpy does (``float32``, ``int64``, ``bfloat16``);
analyses that size tensors and dialects that pick constants both need the numpy
dtype behind a name. Nothing here knows a format's own dtype enums.
"""

from __future__ import annotations


def np_dtype(dtype: str):
    """numpy dtype for a dialect dtype name (bfloat16 via ml_dtypes)."""
    import numpy as np  # here: the CLI imports the IR for --help

    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)
