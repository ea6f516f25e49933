"""baracuda_numba: pure-Python Numba-CUDA kernels for ML ops behind a Plan API.

Pick a plan for a descriptor (``Plan.select``), then ``plan.run(args, stream=...)`` with
PyTorch tensors, CuPy arrays or Numba device arrays. Importing this package imports
neither torch nor CuPy.
"""

from __future__ import annotations

import importlib
from typing import Any

# Lazy attributes (PEP 562): importing the package imports neither Numba, torch nor CuPy,
# so ``baracuda-check`` and the tests can choose the simulator before Numba loads.
_LAZY = {
    "arrays": ("TensorMut", "TensorRef", "as_mut", "as_ref"),
    "debug": ("debug_enabled", "set_debug"),
    "errors": ("BaracudaError", "BufferTooSmall", "DriverError", "InvalidProblem",
               "MisalignedOperand", "Unsupported", "WorkspaceTooSmall"),
    "plans.write_slice": ("WriteSliceArgs", "WriteSliceDescriptor", "WriteSlicePlan"),
    "plans.cross_entropy": (
        "CrossEntropyLossArgs", "CrossEntropyLossBackwardArgs",
        "CrossEntropyLossBackwardDescriptor", "CrossEntropyLossBackwardPlan",
        "CrossEntropyLossDescriptor", "CrossEntropyLossPlan"),
    "plans.fractional_max_pool": (
        "FractionalMaxPool2dBwArgs", "FractionalMaxPool2dDescriptor", "FractionalMaxPool2dFwArgs",
        "FractionalMaxPool2dPlan", "FractionalMaxPool3dBwArgs", "FractionalMaxPool3dDescriptor",
        "FractionalMaxPool3dFwArgs", "FractionalMaxPool3dPlan", "FractionalPlacement"),
    "plans.normalization": ("LayerNormArgs", "LayerNormBackwardArgs", "LayerNormBackwardDescriptor",
                   "LayerNormBackwardPlan", "LayerNormDescriptor", "LayerNormPlan",
                   "RMSNormArgs", "RMSNormBackwardArgs", "RMSNormBackwardDescriptor",
                   "RMSNormBackwardPlan", "RMSNormDescriptor", "RMSNormPlan"),
    "plans.gated_activation": (
        "GatedActivationArgs", "GatedActivationBackwardArgs", "GatedActivationBackwardDescriptor",
        "GatedActivationBackwardPlan", "GatedActivationDescriptor", "GatedActivationPlan"),
    "plans.reduce": ("ArgReduceArgs", "ArgReduceDescriptor", "ArgReducePlan", "ReduceArgs",
                     "ReduceBackwardArgs", "ReduceBackwardDescriptor", "ReduceBackwardPlan",
                     "ReduceDescriptor", "ReducePlan"),
    "plans.rope": ("RopeArgs", "RopeBackwardArgs", "RopeBackwardDescriptor", "RopeBackwardPlan",
                   "RopeDescriptor", "RopePlan"),
    "plans.rope_kv_cache": ("RopeKvCacheAppendArgs", "RopeKvCacheAppendDescriptor",
                            "RopeKvCacheAppendPlan"),
    "rope_scaling": ("default_inv_freq", "dynamic_ntk_inv_freq", "linear_inv_freq",
                     "llama3_inv_freq", "yarn_inv_freq"),
    "plans.scan": ("ScanArgs", "ScanBackwardArgs", "ScanBackwardDescriptor", "ScanBackwardPlan",
                   "ScanDescriptor", "ScanPlan"),
    "precompile": ("warmup",),
    "plans.softmax": ("SoftmaxArgs", "SoftmaxBackwardArgs", "SoftmaxBackwardDescriptor",
                      "SoftmaxBackwardPlan", "SoftmaxDescriptor", "SoftmaxPlan"),
    "streams": ("stream_handle",),
    "types": ("ArchSku", "AttentionKind", "BackendKind", "ElementKind", "GatedActivationKind",
              "KernelSku", "CrossEntropyTargetKind", "LossKind", "LossReduction",
              "MathPrecision", "NormalizationKind", "OpCategory", "PlanPreference", "PoolKind",
              "PrecisionGuarantee", "ReduceKind", "RopeAngleSource", "RopeLayout",
              "RopePairing", "ScanKind",
              "ShapeLayoutKind", "SoftmaxKind"),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'baracuda_numba' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_WHERE))


__version__ = "0.1.0"

__all__ = sorted(_WHERE)  # noqa: PLE0605 (lazy attributes, resolved by __getattr__)

