"""How a model turns its LM head's output into logits: a multiplier, then an optional soft cap.

With z = hidden @ W.T (+ bias), a model's logits are ``scale·z`` (Cohere's ``logit_scale``, Granite's
``1 / logits_scaling``, Falcon-H1's ``lm_head_multiplier``) or ``cap·tanh(scale·z / cap)`` (Gemma-2's
``final_logit_softcapping``, with scale 1). The loss, its statistics and the logit-mean metrics are those of
the transformed logits; the gradient reaches z through the chain rule, dlogit/dz = scale·(1 − tanh²).
"""

import math
import numbers
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogitTransform:
    scale: float = 1.0
    softcap: float | None = None  # None: no cap

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.softcap is None

    @property
    def linear(self) -> bool:
        """Sums of logits are the scale times sums of z (no cap): a dropped row's logits need no GEMM of their own."""
        return self.softcap is None

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """The model's logits from z, in z's dtype, in the order the models compute them."""
        if self.scale != 1.0:
            z = z * self.scale
        if self.softcap is not None:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z


IDENTITY = LogitTransform()


def logit_transform(logit_scale, logit_softcap) -> LogitTransform:
    """The options ``logit_scale`` (a positive multiplier) and ``logit_softcap`` (None or a positive cap), checked."""
    for name, value in (("logit_scale", logit_scale), ("logit_softcap", logit_softcap)):
        if value is None and name == "logit_softcap":
            continue
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"{name} must be a real number{' or None' if name == 'logit_softcap' else ''}, "
                            f"got {type(value).__name__}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite, got {value}")
    return LogitTransform(float(logit_scale), None if logit_softcap is None else float(logit_softcap))
