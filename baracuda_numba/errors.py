"""The error hierarchy. Every message names the plan and the offending argument.

Plans raise these before anything is launched, so a rejected call writes nothing.
"""

from __future__ import annotations

__all__ = [
    "BaracudaError",
    "BufferTooSmall",
    "DriverError",
    "InvalidProblem",
    "MisalignedOperand",
    "Unsupported",
    "WorkspaceTooSmall",
]


class BaracudaError(Exception):
    """Base class of every error this package raises on purpose."""


class Unsupported(BaracudaError, NotImplementedError):
    """The request is well formed but outside what the plan implements (dtype, rank > 8, ...)."""


class InvalidProblem(BaracudaError, ValueError):
    """The request is inconsistent: shapes, ranges, axes, missing saved tensors, ..."""


class MisalignedOperand(BaracudaError, ValueError):
    """A pointer or stride is not a whole number of elements (or not aligned as required)."""


class BufferTooSmall(BaracudaError, ValueError):
    """An array's memory does not cover the extent the descriptor needs."""

    def __init__(self, message: str, needed: int, got: int) -> None:
        super().__init__(f"{message} (needed {needed}, got {got})")
        self.needed = needed
        self.got = got


class WorkspaceTooSmall(BaracudaError, ValueError):
    """The workspace passed to ``run`` is smaller than ``plan.workspace_size``."""

    def __init__(self, message: str, needed: int, got: int) -> None:
        super().__init__(f"{message} (needed {needed} bytes, got {got})")
        self.needed = needed
        self.got = got


class DriverError(BaracudaError, RuntimeError):
    """A CUDA driver call failed; ``code`` is the ``CUresult``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(f"{message}: CUDA driver error {code}")
        self.code = code
