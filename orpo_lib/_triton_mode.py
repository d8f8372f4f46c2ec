"""Decide, once and before any kernel is defined, whether Triton compiles or interprets.

Without a CUDA device the kernels run through the Triton interpreter on CPU tensors. The mode is
fixed when ``@triton.jit`` runs, so this module must be imported before ``orpo_lib.kernels``; where
something imported triton earlier, triton's own helpers are re-decorated here to match.
"""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _interpret_triton_helpers():
    """Re-decorate triton's own ``@jit`` helpers (``tl.zeros``, ``tl.sum``, ``tl.cumsum``, ...) for the interpreter.

    triton decorates them when ``triton.language`` is first imported, so where that happened before
    TRITON_INTERPRET was set (TRL, transformers and ``torch._dynamo`` import triton) they are compiled-mode
    functions, which raise "Cannot call @triton.jit'd outside of the scope of a kernel" when an interpreted
    kernel calls them. Gluon's helpers (a subclass of JITFunction) are compiled either way and stay as they are.
    """
    import triton
    from triton.runtime.jit import JITFunction

    interpreted = {}  # id of a compiled helper -> its interpreted twin, one per helper wherever it is bound

    def twin(helper):
        if id(helper) not in interpreted:
            interpreted[id(helper)] = triton.jit(helper.fn)  # TRITON_INTERPRET is set: an InterpretedFunction
        return interpreted[id(helper)]

    def method(helper):
        # an interpreted helper is no descriptor: bind it as triton does when imported in the interpreter's mode
        def call(*args, **kwargs):
            return helper(*args, **kwargs)
        return call

    for name, module in list(sys.modules.items()):
        if module is not None and (name == "triton.language" or name.startswith("triton.language.")):
            for attr, value in list(vars(module).items()):
                if type(value) is JITFunction:
                    setattr(module, attr, twin(value))
    tensor = triton.language.core.tensor  # its methods x.sum(), x.cumsum(), ... are the same helpers
    for attr, value in list(vars(tensor).items()):
        if type(value) is JITFunction:
            setattr(tensor, attr, method(twin(value)))


if INTERPRET and "triton.language" in sys.modules:
    _interpret_triton_helpers()
