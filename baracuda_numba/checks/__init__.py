"""The check registry behind ``baracuda-check``: one module per op family.

Each module ``checks/<family>.py`` defines ``cases(simulator: bool) -> list[CheckCase]``
(small shapes when ``simulator`` is true). A case's ``run`` draws fresh inputs, runs the
plan on the device (or the simulator), compares with a NumPy float64 reference and
returns ``(max_error, tolerance)``; it passes when ``max_error <= tolerance``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CheckCase", "all_cases", "families"]


@dataclass(frozen=True)
class CheckCase:
    family: str  # module name: write_slice, scan, reduce, rope, fractional_max_pool
    plan: str  # e.g. "WriteSlicePlan" or "ScanBackwardPlan"
    dtype: str  # ElementKind name
    shape: str  # shape / axis / options, as shown in the report
    run: Callable[[], tuple[float, float]]


def families() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(__path__))


def all_cases(simulator: bool, only_families: list[str] | None = None) -> list[CheckCase]:
    out: list[CheckCase] = []
    for family in families():
        if only_families and family not in only_families:
            continue
        module = importlib.import_module(f"{__name__}.{family}")
        out.extend(module.cases(simulator))
    return out
