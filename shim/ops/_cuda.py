"""The CUDA path of the fused ops: the plain composed math, fused by ``torch.compile``.

Inductor turns each composed function into one or two Triton kernels, which is what the
hand-written CPU paths emulate with in-place ops. Nothing is compiled until a CUDA tensor
reaches the op, so importing shim (or running on CPU) never touches the compiler.
"""

from __future__ import annotations

import functools

import torch


def compiled_on_first_use(fn):
    """``fn`` compiled with ``torch.compile`` the first time it is called."""
    compiled = None

    @functools.wraps(fn)
    def run(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True)
        return compiled(*args, **kwargs)

    return run
