"""The package's one debug switch: ``BARACUDA_DEBUG=1`` in the environment.

Off by default. When on, plans run checks that need the data on the device and so cost a
host synchronisation, e.g. ``CrossEntropyLossPlan`` counts targets outside ``[0, V)``
(other than ``ignore_index``) before its main kernel and raises ``InvalidProblem``.
Read once at import; :func:`set_debug` changes it for the process (also
``baracuda_numba.set_debug``).
"""

from __future__ import annotations

import os

__all__ = ["debug_enabled", "set_debug"]

_DEBUG = [os.environ.get("BARACUDA_DEBUG", "").strip().lower() not in ("", "0", "false", "no")]


def debug_enabled() -> bool:
    """Whether the debug checks run."""
    return _DEBUG[0]


def set_debug(enabled: bool) -> None:
    """Turn the debug checks on or off for this process."""
    _DEBUG[0] = bool(enabled)
