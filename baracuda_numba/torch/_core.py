"""What the torch layer's families share: the custom-op namespace, the compile test and
small helpers.

Every op is registered as ``baracuda::<name>``, so ``torch.compile`` treats it as one
opaque node (no graph break), and its ``register_fake`` gives shapes to the tracer. In
eager mode the public functions skip the ``torch.library`` dispatcher (host time per call)
and go through an equivalent ``torch.autograd.Function``; under ``torch.compile`` they call
the custom ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LIB", "EagerFunction", "compiling", "needs_grad", "no_indices"]

#: The ``torch.library`` namespace of every custom op of the package.
LIB = "baracuda"
compiling = torch.compiler.is_compiling


def no_indices(x: Tensor) -> Tensor:
    """The empty int64 tensor that stands for "no indices" in a custom op's output."""
    return x.new_empty((0,), dtype=torch.int64)


def needs_grad(x: Tensor) -> bool:
    return x.requires_grad and torch.is_grad_enabled()


class EagerFunction(torch.autograd.Function):
    """``torch.autograd.Function`` for the eager twins of the custom ops: ``forward(*inputs)``
    plus ``setup_context`` (the custom op's own functions), applied without the signature
    binding ``Function.apply`` does on every call where ``setup_context`` is defined (an
    ``inspect.signature`` of ``forward`` per call: several times the host time of the
    rest of ``apply``). The twins pass every input positionally, so there are no defaults
    to bind; under functorch transforms ``Function.apply`` runs as usual."""

    @classmethod
    def apply(cls, *args):
        if _transforms_active():
            return super().apply(*args)
        return super(torch.autograd.Function, cls).apply(*args)


#: Whether torch.func transforms are active (what ``Function.apply`` itself asks); a torch
#: without the query always takes ``Function.apply``.
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)

