"""orpo_lib: a fused linear + ORPO preference loss whose logits never reach memory in full."""

from . import _triton_mode  # noqa: F401  (must run before the kernels are defined)
from .baseline import orpo_loss_baseline
from .fused import FusedLinearORPOLoss, fused_linear_orpo_loss
from .output import ORPOOutput
from .reference import orpo_loss_reference
from .vocab_parallel import vocab_parallel_orpo_loss

__all__ = [
    "FusedLinearORPOLoss",
    "ORPOOutput",
    "fused_linear_orpo_loss",
    "orpo_loss_baseline",
    "orpo_loss_reference",
    "vocab_parallel_orpo_loss",
]
