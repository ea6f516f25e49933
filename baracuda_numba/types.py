"""Core vocabulary shared by every plan: element kinds, op kinds, SKUs, preferences.

Mirrors upstream ``baracuda-kernel-vocab`` (enum discriminants match upstream so SKUs can
be compared across the two projects) in Python style: ``Enum`` members and frozen
dataclasses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ArchSku",
    "AttentionKind",
    "BackendKind",
    "CrossEntropyTargetKind",
    "ElementKind",
    "GatedActivationKind",
    "KernelSku",
    "LossKind",
    "LossReduction",
    "MathPrecision",
    "NormalizationKind",
    "OpCategory",
    "PlanPreference",
    "PoolKind",
    "PrecisionGuarantee",
    "ReduceKind",
    "RopeAngleSource",
    "RopeLayout",
    "RopePairing",
    "ScanKind",
    "ShapeLayoutKind",
    "SoftmaxKind",
]


class ElementKind(enum.Enum):
    """Logical element type of a tensor.

    ``storage_bits`` is the size of one element in memory, ``storage_dtype`` the NumPy
    dtype a kernel sees (bf16 travels as ``uint16``, fp8 as ``uint8``; the nibble kinds
    S4/U4 pack two elements per ``uint8``), ``typestrs`` the ``__cuda_array_interface__``
    typestrs accepted for arrays of this kind.
    """

    # value: (upstream discriminant, storage bits, storage dtype, accepted typestrs)
    F16 = (0, 16, "float16", ("<f2",))
    BF16 = (1, 16, "uint16", ("<V2", "|V2", "<u2"))
    F32 = (2, 32, "float32", ("<f4",))
    F32_STRICT = (3, 32, "float32", ("<f4",))
    F64 = (4, 64, "float64", ("<f8",))
    S8 = (5, 8, "int8", ("|i1",))
    U8 = (6, 8, "uint8", ("|u1",))
    I32 = (7, 32, "int32", ("<i4",))
    I64 = (8, 64, "int64", ("<i8",))
    BOOL = (9, 8, "bool", ("|b1", "|u1"))
    FP8_E4M3 = (10, 8, "uint8", ("|V1", "|u1"))
    FP8_E5M2 = (11, 8, "uint8", ("|V1", "|u1"))
    S4 = (12, 4, "uint8", ("|u1", "|i1", "|V1"))
    U4 = (13, 4, "uint8", ("|u1", "|i1", "|V1"))
    BIN = (14, 1, "uint8", ("|u1",))
    COMPLEX32 = (15, 64, "complex64", ("<c8",))
    COMPLEX64 = (16, 128, "complex128", ("<c16",))
    U32 = (17, 32, "uint32", ("<u4",))

    @property
    def discriminant(self) -> int:
        return self.value[0]

    @property
    def storage_bits(self) -> int:
        return self.value[1]

    @property
    def storage_dtype(self) -> np.dtype:
        """NumPy dtype of one storage unit (a byte for the sub-byte kinds)."""
        return np.dtype(self.value[2])

    @property
    def typestrs(self) -> tuple[str, ...]:
        return self.value[3]

    @property
    def byte_width(self) -> int:
        """Bytes per storage unit (1 for the sub-byte kinds)."""
        return max(1, self.storage_bits // 8)

    @property
    def is_subbyte(self) -> bool:
        return self.storage_bits < 8

    @property
    def is_float(self) -> bool:
        return self in (ElementKind.F16, ElementKind.BF16, ElementKind.F32,
                        ElementKind.F32_STRICT, ElementKind.F64)

    @classmethod
    def from_dtype(cls, dtype: object) -> ElementKind:
        """The kind for a NumPy/Torch/CuPy dtype or dtype name ('bfloat16' -> BF16)."""
        name = str(dtype).removeprefix("torch.")
        named = _DTYPE_NAMES.get(name)
        if named is not None:
            return named
        raise ValueError(f"ElementKind.from_dtype: no element kind for dtype {dtype!r}")

    def __repr__(self) -> str:
        return f"ElementKind.{self.name}"


_DTYPE_NAMES = {
    "float16": ElementKind.F16, "half": ElementKind.F16,
    "bfloat16": ElementKind.BF16,
    "float32": ElementKind.F32, "float": ElementKind.F32,
    "float64": ElementKind.F64, "double": ElementKind.F64,
    "int8": ElementKind.S8, "uint8": ElementKind.U8,
    "int32": ElementKind.I32, "int64": ElementKind.I64, "uint32": ElementKind.U32,
    "bool": ElementKind.BOOL,
    "float8_e4m3fn": ElementKind.FP8_E4M3, "float8_e5m2": ElementKind.FP8_E5M2,
    "complex64": ElementKind.COMPLEX32, "complex128": ElementKind.COMPLEX64,
}


class MathPrecision(enum.Enum):
    F16 = 0
    BF16 = 1
    TF32 = 2
    F32 = 3
    F64 = 4
    INT8 = 5
    FP8_E4M3 = 6
    FP8_E5M2 = 7
    INT4 = 8
    BINARY = 9
    INT64 = 10  # integer kernels (wrap-around arithmetic); not in upstream


class OpCategory(enum.Enum):
    GEMM = 0
    UNARY_ELEMENTWISE = 1
    BINARY_ELEMENTWISE = 2
    TERNARY_ELEMENTWISE = 3
    GATED_ACTIVATION = 4
    REDUCTION = 5
    SCAN = 6
    NORMALIZATION = 7
    SOFTMAX = 8
    CONVOLUTION = 9
    POOLING = 10
    ATTENTION = 11
    INDEXING = 12
    EMBEDDING = 13
    SHAPE_LAYOUT = 14
    SORTING = 15
    QUANTIZATION = 16
    RANDOM = 17
    LOSS = 18
    SEGMENT_OPS = 19
    IMAGE = 20
    FFT = 21
    LINALG = 22
    MOE = 23


class BackendKind(enum.Enum):
    """Where the kernel comes from. ``BESPOKE`` = a Numba-CUDA kernel of this package;
    ``DRIVER_COPY`` = a CUDA driver copy (cuMemcpy*), used by copy fast paths."""

    BESPOKE = 0
    CUTLASS = 1
    CUBLAS = 2
    CUDNN = 3
    CUFFT = 4
    CUSPARSE = 5
    CUSOLVER = 6
    CURAND = 7
    CUTENSOR = 8
    NPP = 9
    CVCUDA = 10
    FLASH_ATTENTION_V2 = 11
    FLASH_INFER = 12
    DRIVER_COPY = 100


class ArchSku(enum.Enum):
    SM80 = 0
    SM89 = 1
    SM90A = 2


class ScanKind(enum.IntEnum):
    CUMSUM = 0
    CUMPROD = 1
    CUMMAX = 2
    CUMMIN = 3
    LOG_CUMSUM_EXP = 4


class ReduceKind(enum.IntEnum):
    SUM = 0
    MEAN = 1
    MAX = 2
    MIN = 3
    PROD = 4
    VAR = 5
    STD = 6
    NORM2 = 7
    ARGMAX = 8
    ARGMIN = 9
    ANY = 10
    ALL = 11
    LOG_SUM_EXP = 12
    TRACE = 13
    COUNT_NONZERO = 14


class PoolKind(enum.IntEnum):
    MAX_POOL2D = 0
    MAX_POOL2D_BACKWARD = 1
    AVG_POOL2D_INCLUDE_PAD = 2
    AVG_POOL2D_INCLUDE_PAD_BACKWARD = 3
    AVG_POOL2D_EXCLUDE_PAD = 4
    AVG_POOL2D_EXCLUDE_PAD_BACKWARD = 5
    MAX_POOL1D = 6
    AVG_POOL1D = 7
    MAX_POOL3D = 8
    AVG_POOL3D = 9
    ADAPTIVE_MAX_POOL = 10
    ADAPTIVE_AVG_POOL = 11
    LP_POOL = 12
    FRACTIONAL_MAX_POOL = 13
    MAX_POOL1D_BACKWARD = 14
    AVG_POOL1D_INCLUDE_PAD = 15
    AVG_POOL1D_INCLUDE_PAD_BACKWARD = 16
    AVG_POOL1D_EXCLUDE_PAD = 17
    AVG_POOL1D_EXCLUDE_PAD_BACKWARD = 18
    MAX_POOL3D_BACKWARD = 19
    AVG_POOL3D_INCLUDE_PAD = 20
    AVG_POOL3D_INCLUDE_PAD_BACKWARD = 21
    AVG_POOL3D_EXCLUDE_PAD = 22
    AVG_POOL3D_EXCLUDE_PAD_BACKWARD = 23
    ADAPTIVE_AVG_POOL1D = 24
    ADAPTIVE_AVG_POOL1D_BACKWARD = 25
    ADAPTIVE_AVG_POOL2D = 26
    ADAPTIVE_AVG_POOL2D_BACKWARD = 27
    ADAPTIVE_AVG_POOL3D = 28
    ADAPTIVE_AVG_POOL3D_BACKWARD = 29
    ADAPTIVE_MAX_POOL1D = 30
    ADAPTIVE_MAX_POOL1D_BACKWARD = 31
    ADAPTIVE_MAX_POOL2D = 32
    ADAPTIVE_MAX_POOL2D_BACKWARD = 33
    ADAPTIVE_MAX_POOL3D = 34
    ADAPTIVE_MAX_POOL3D_BACKWARD = 35
    LP_POOL1D = 36
    LP_POOL2D = 37
    FRACTIONAL_MAX_POOL2D = 38
    FRACTIONAL_MAX_POOL3D = 39
    LP_POOL1D_BACKWARD = 40
    LP_POOL2D_BACKWARD = 41
    FRACTIONAL_MAX_POOL2D_BACKWARD = 42
    FRACTIONAL_MAX_POOL3D_BACKWARD = 43


class AttentionKind(enum.IntEnum):
    ROPE = 0
    ALIBI = 1
    SDPA = 2
    FLASH_ATTENTION = 3
    KV_CACHE = 4
    PAGED_ATTENTION = 5
    HYPER_CONNECTION = 6
    SSD_CHUNK_SCAN = 7
    SELECTIVE_SCAN = 8
    BLOCK_SPARSE_ATTENTION = 9
    RING_ATTENTION = 10


class ShapeLayoutKind(enum.IntEnum):
    PAD = 0
    CONCAT = 1
    PERMUTE = 2
    REPEAT = 3
    FLIP = 4
    ROLL = 5
    MESHGRID = 6
    FILL = 7
    WRITE_SLICE = 8
    CONTIGUIZE = 9
    TRIU = 10
    TRIL = 11


class RopePairing(enum.Enum):
    """Which features form a rotated pair: GPT-J ``(2i, 2i+1)`` or NeoX ``(i, i + D/2)``."""

    INTERLEAVED = 0
    HALF_SPLIT = 1


@dataclass(frozen=True, slots=True)
class PrecisionGuarantee:
    """What a kernel promises numerically.

    ``accumulator`` is the element kind intermediate results are held in;
    ``bit_stable_on_same_hardware`` means two runs with the same inputs give the same bits;
    ``deterministic`` means the result does not depend on scheduling (no atomics races).
    """

    math_precision: MathPrecision
    accumulator: ElementKind
    bit_stable_on_same_hardware: bool
    deterministic: bool


@dataclass(frozen=True, slots=True)
class KernelSku:
    """Identity of the kernel a plan picked (telemetry / autotune cache key)."""

    category: OpCategory
    op: int
    element: ElementKind
    aux_element: ElementKind | None
    layout: str | None
    epilogue: str | None
    arch: ArchSku
    backend: BackendKind
    precision_guarantee: PrecisionGuarantee


@dataclass(frozen=True, slots=True)
class PlanPreference:
    """Caller's preferences for ``select``.

    ``max_workspace_bytes=None`` means unlimited; ``prefer_backend`` is a hint only.
    """

    max_workspace_bytes: int | None = None
    prefer_backend: BackendKind | None = None
    allow_sm90a: bool = True


# Enum's own __hash__ is a Python-level hash(self._name_) (a Python call); plan caches and layout
# keys hash these members on every call. Members are singletons compared by identity
# (Enum) or as ints (IntEnum), so the C-level hash of the same notion is consistent.
for _enum in (ElementKind, MathPrecision, OpCategory, BackendKind, ArchSku, RopePairing):
    _enum.__hash__ = object.__hash__  # type: ignore[method-assign]
for _enum in (ScanKind, ReduceKind, PoolKind, AttentionKind, ShapeLayoutKind):
    _enum.__hash__ = int.__hash__  # type: ignore[method-assign]
del _enum


class NormalizationKind(enum.IntEnum):
    """Upstream's ``NormalizationKind`` (``ops.rs``): the ``op`` of a normalization SKU."""

    RMS_NORM = 0
    LAYER_NORM = 1
    GROUP_NORM = 2
    BATCH_NORM = 3
    INSTANCE_NORM = 4


class GatedActivationKind(enum.IntEnum):
    """Upstream's ``GatedActivationKind`` (``ops.rs``): ``y = act(gate) · up`` with act
    sigmoid (``GLU``, ``F.glu``), relu (``REGLU``), silu (``SWIGLU``) or gelu (``GEGLU``)."""

    GLU = 0
    REGLU = 1
    SWIGLU = 2
    GEGLU = 3


GatedActivationKind.__hash__ = int.__hash__  # type: ignore[method-assign]  (see above)


class SoftmaxKind(enum.IntEnum):
    """Upstream's ``SoftmaxKind`` (``ops.rs``): the ``op`` of a softmax SKU.
    ``GUMBEL_SOFTMAX`` and ``SPARSEMAX`` are reserved (``SoftmaxPlan``: Unsupported)."""

    SOFTMAX = 0
    LOG_SOFTMAX = 1
    GUMBEL_SOFTMAX = 2
    SPARSEMAX = 3


SoftmaxKind.__hash__ = int.__hash__  # type: ignore[method-assign]  (see above)


class RopeLayout(enum.IntEnum):
    """Axis order of RoPE's q/k tensors: ``[B, H, S, D]``, ``[B, S, H, D]`` (HF) or packed
    ``[T, H, D]`` tokens (varlen, with ``cu_seqlens`` or per-token positions)."""

    BHSD = 0
    BSHD = 1
    THD = 2


class RopeAngleSource(enum.IntEnum):
    """Where RoPE's angles come from: ``base`` (``θ = pos·base^(−2i/R)``), an ``inv_freq``
    vector ``[R/2]`` (any scaling rule), cos/sin caches ``[S_max, R | R/2]`` indexed by
    position (flash-attn, vLLM), or cos/sin already gathered per token ``[1 | B, S, R | R/2]``
    (HF's rotary embedding output, Liger)."""

    BASE = 0
    INV_FREQ = 1
    COS_SIN_CACHE = 2
    COS_SIN_GATHERED = 3


class LossKind(enum.IntEnum):
    """Upstream's loss kinds (``ops.rs``); the SKU ``op`` of a loss plan."""

    MSE = 0
    NLL = 1
    CROSS_ENTROPY = 2
    BCE = 3
    KL_DIV = 4
    L1 = 5
    SMOOTH_L1 = 6
    HINGE_EMBEDDING = 7
    MARGIN_RANKING = 8
    TRIPLET_MARGIN = 9
    CTC = 10
    POISSON_NLL = 11
    HUBER = 12
    BCE_WITH_LOGITS = 13
    GAUSSIAN_NLL = 14
    COSINE_EMBEDDING = 15
    MULTI_MARGIN = 16
    MULTILABEL_MARGIN = 17
    MULTILABEL_SOFT_MARGIN = 18
    FUSED_LINEAR_CROSS_ENTROPY = 19


class LossReduction(enum.IntEnum):
    """How a loss over rows is reduced (upstream's ``reduction_mode``)."""

    NONE = 0
    MEAN = 1
    SUM = 2


class CrossEntropyTargetKind(enum.IntEnum):
    """Class indices ``[N]`` or soft probabilities ``[N, V]`` (only the former here)."""

    CLASS_INDEX = 0
    SOFT_PROB = 1
