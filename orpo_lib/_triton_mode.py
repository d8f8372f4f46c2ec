"""Decide, once and before any kernel is defined, whether Triton compiles or interprets.

Without a CUDA device the kernels run through the Triton interpreter on CPU tensors. The mode is
fixed when ``@triton.jit`` runs, so this module must be imported before ``orpo_lib.kernels``.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
