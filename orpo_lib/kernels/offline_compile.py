"""Compiling a Gluon kernel for a GPU target without a GPU (the CPU tests' look at the code a GPU would run).

The arguments are host CPU tensors standing in for device ones: only their dtype, shape and alignment
matter to the compiler. The binding mirrors what ``kernel[grid](...)`` does (and what triton's own
``triton._filecheck.run_parser`` does).
"""

import triton


def compile_kernel(kernel, args, opts, target=None):
    """The Gluon ``kernel`` compiled for ``args`` and ``opts`` (its launch keywords) down to a cubin, for
    ``target`` (default sm_90a). Returns triton's CompiledKernel, whose ``asm`` holds the ttgir, ptx and cubin."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = target or GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*args, **opts)
    options, signature, constexprs, attrs = kernel._pack_args(backend, opts, bound_args, specialization, options)
    src = GluonASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=target, options=options.__dict__)
