"""How the row kernels see a chunk of logits: one program per row of a (C, V) buffer with unit column
stride, the row's two target ids (-1: the token does not count for that target) and its index among
the B*T tokens, where the per-token statistics live."""

from dataclasses import dataclass

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import triton
import triton.language as tl


@triton.jit
def this_row(row, logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr):
    # A row of the chunk: its address, its two target ids and its index among the B*T tokens.
    return (logits_ptr + stride_row.to(tl.int64) * row, tl.load(target_ptr + row), tl.load(nll_target_ptr + row),
            tl.load(token_ptr + row))


@dataclass(frozen=True)
class RowLaunch:
    """Launch configuration of a row kernel (one program per row)."""

    block_v: int  # vocabulary entries per loop step
    num_warps: int


def block_v(vocab: int, launch: RowLaunch) -> int:
    """The loop step: a power of two no larger than the row, so that every row has at least one whole block."""
    return min(launch.block_v, 1 << (vocab.bit_length() - 1))


def rows_of(logits) -> tuple[int, int]:
    """(C, V) of a chunk, checking the unit column stride the kernels assume."""
    if logits.stride(1) != 1:
        raise ValueError("logits chunk must have unit stride along the vocabulary")
    return logits.shape
