"""Precise device math the kernels share (``tl`` has no log1p or expm1)."""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

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
