"""Precise device math the kernels share (``tl`` has no log1p or expm1)."""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import numpy as np
import triton
import triton.language as tl


@triton.jit
def log1p(x):
    # log(1 + x) without losing a tiny x to rounding (Goldberg's trick; tl has no log1p).
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * (x / tl.where(u == 1.0, 1.0, u - 1.0)))


@triton.jit
def expm1(x):
    # exp(x) - 1 for x <= 0. Near 0, Kahan's trick keeps a tiny x from rounding away (tl has no expm1);
    # below -1/2 the plain difference has no cancellation, and the trick would fail where exp(x) is a
    # float32 subnormal (x < -87.3: its log is no longer x), so the plain form is used there.
    u = tl.exp(x)
    ratio = (u - 1.0) * x / tl.log(tl.where((u == 1.0) | (u == 0.0), 0.5, u))
    return tl.where(x < -0.5, u - 1.0, tl.where(u == 1.0, x, ratio))


@triton.jit
def log1mexp(x):
    # log(1 - exp(x)) for x < 0, accurate on both sides of -ln 2 (Mächler 2012); each branch gets
    # an argument clamped to its own side, so the one not taken never evaluates log(0)
    ln_half = -0.6931471805599453
    return tl.where(x > ln_half, tl.log(-expm1(tl.maximum(x, ln_half))), log1p(-tl.exp(tl.minimum(x, ln_half))))


@triton.jit
def _constant(head, rest, dtype):
    # head + rest, two float32 arguments, summed in dtype
    return tl.full((), 0.0, dtype) + head + rest


@triton.jit
def model_logits(x, inner, inner_rest, outer, outer_rest, SCALED: tl.constexpr, SOFTCAPPED: tl.constexpr):
    # A model's logits from its head's output x (logit_transform.py), and their slope dlogit/dx:
    # outer·tanh(inner·x) and inner·outer·(1 - tanh²) with a cap (inner = scale / cap, outer = cap), inner·x and
    # inner with a scale alone, x and 1 otherwise. Each constant comes as a float32 and what its rounding left
    # out (model_logits_args), so that float64 rows get float64 constants.
    slope = 1.0
    if SOFTCAPPED:
        inner = _constant(inner, inner_rest, x.dtype)
        outer = _constant(outer, outer_rest, x.dtype)
        # tanh and 1 - tanh² from e = exp(-2|u|) alone: nothing overflows where tanh saturates (e -> 0,
        # slope -> 0), and where it does not, the cap times float32 rounding is a far smaller absolute
        # error than any logit's own (softmax is shift-invariant, so absolute errors are what count).
        u = x * inner
        e = tl.exp(-2.0 * tl.abs(u))
        r = 1.0 / (1.0 + e)  # one reciprocal for both (the special-function unit is what a cap costs)
        t = (1.0 - e) * r
        x = outer * tl.where(u < 0, -t, t)
        slope = inner * outer * 4.0 * e * r * r
    elif SCALED:
        inner = _constant(inner, inner_rest, x.dtype)
        x = x * inner
        slope = inner
    return x, slope


@triton.jit
def model_logits_only(x, inner, inner_rest, outer, outer_rest, SCALED: tl.constexpr, SOFTCAPPED: tl.constexpr):
    # model_logits without the slope (the statistics need none)
    logits, slope = model_logits(x, inner, inner_rest, outer, outer_rest, SCALED, SOFTCAPPED)
    return logits


def _float32_parts(value: float) -> tuple:
    """value as a float32 and the float32 rounding of what that left out: together float64-close."""
    head = float(np.float32(value))
    return head, float(np.float32(value - head))


def model_logits_args(transform) -> tuple:
    """``model_logits``' runtime arguments (inner, inner_rest, outer, outer_rest) for a ``LogitTransform``."""
    if transform.softcap is None:
        return (*_float32_parts(transform.scale), 1.0, 0.0)
    return (*_float32_parts(transform.scale / transform.softcap), *_float32_parts(transform.softcap))


def model_logits_flags(transform) -> dict:
    """``model_logits``' constexpr flags for a ``LogitTransform``: an identity compiles to the plain kernel."""
    return dict(SCALED=transform.scale != 1.0, SOFTCAPPED=transform.softcap is not None)
