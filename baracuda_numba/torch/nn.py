"""``torch.nn`` modules over the package's fused ops, drop-in for the ones they replace.

* ``RMSNorm``: ``torch.nn.RMSNorm`` and transformers' ``LlamaRMSNorm`` (``rms_norm``);
* ``GemmaRMSNorm``: transformers' ``Gemma2RMSNorm``, ``x̂ · (1 + w)`` (``rms_norm(offset=1)``);
* ``LayerNorm``: ``torch.nn.LayerNorm`` (``layer_norm``);
* ``SwiGLUMLP`` / ``GeGLUMLP``: transformers' ``LlamaMLP`` / ``Gemma2MLP``, gate/up/down
  projections around the fused ``swiglu`` / ``geglu(approximate="tanh")``;
* ``CrossEntropyLoss``: ``torch.nn.CrossEntropyLoss`` plus ``z_loss`` and ``softcap``
  (``cross_entropy``);
* ``FusedLinearCrossEntropyLoss``: ``F.linear`` then ``F.cross_entropy`` without the logits
  (``fused_linear_cross_entropy``);

plus :func:`apply_rotary_pos_emb`, transformers' rotary helper (``q``, ``k``
``[B, H, S, D]``, ``cos``/``sin`` ``[B, S, D]`` as transformers' rotary embedding returns
them) on the package's ``rope``.

Each module's forward is one call of a ``baracuda_numba.torch`` function, so under
``torch.compile`` it is one ``torch.library`` custom op (no graph break) and in eager mode
one ``autograd.Function``. Under ``torch.autocast`` the ops take the dtypes they are given
(they are not autocast ops): a norm fed f32 runs in f32, as the modules it replaces;
:class:`FusedLinearCrossEntropyLoss` casts its matmul operands to the autocast dtype itself,
since its matmul runs inside the op.

Deliberate differences: ``RMSNorm``'s ``eps`` defaults to ``1e-6`` (transformers' default;
pass ``eps=None`` for ``torch.nn.RMSNorm``'s ``finfo(dtype).eps``), and its output has the
input's dtype (transformers' ``LlamaRMSNorm`` with an f32 weight and a 16-bit input returns
f32). ``CrossEntropyLoss`` takes class-index targets only (no probability targets).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidProblem, Unsupported
from .cross_entropy import cross_entropy, fused_linear_cross_entropy
from .gated_activation import geglu, swiglu
from .normalization import layer_norm, rms_norm
from .rope import rope

__all__ = ["CrossEntropyLoss", "FusedLinearCrossEntropyLoss", "GeGLUMLP", "GemmaRMSNorm",
           "LayerNorm", "RMSNorm", "SwiGLUMLP", "apply_rotary_pos_emb", "gated_activation_of",
           "linear_cross_entropy"]

#: transformers' activation names (``config.hidden_act`` / ``hidden_activation``) -> the
#: gated op and GeGLU's ``approximate``.
_ACTIVATIONS: dict[str, tuple[str, str]] = {
    "silu": ("swiglu", "none"), "swish": ("swiglu", "none"),
    "gelu": ("geglu", "none"),
    "gelu_pytorch_tanh": ("geglu", "tanh"), "gelu_tanh": ("geglu", "tanh"),
}
_REDUCTIONS = ("none", "mean", "sum")


def _shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(s) for s in normalized_shape)


def _norm_weight(weight: Tensor | None, x: Tensor) -> Tensor | None:
    """The weight as the norm ops take it: the input's dtype, or f32 as it is."""
    if weight is None or weight.dtype in (x.dtype, torch.float32):
        return weight
    return weight.to(x.dtype)


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x², last axes) + eps) · (offset + weight)``, with an optional
    fused residual add (``forward(x, residual)`` returns ``(y, x + residual)``).

    ``RMSNorm(hidden_size, eps)`` loads transformers' ``LlamaRMSNorm`` checkpoints and
    ``RMSNorm(normalized_shape, eps, elementwise_affine)`` torch's (``state_dict`` key
    ``weight``). ``offset=1.0`` is Gemma's ``x̂ · (1 + w)`` (weight initialised to zeros)."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = 1e-6,
                 elementwise_affine: bool = True, *, offset: float = 0.0,
                 device: Any = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.offset = float(offset)
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device,
                                                   dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.offset)  # offset + weight = 1

    @property
    def variance_epsilon(self) -> float | None:
        """transformers' name of ``eps``."""
        return self.eps

    @variance_epsilon.setter
    def variance_epsilon(self, value: float | None) -> None:
        self.eps = value

    def forward(self, x: Tensor, residual: Tensor | None = None
                ) -> Tensor | tuple[Tensor, Tensor]:
        return rms_norm(x, self.normalized_shape, _norm_weight(self.weight, x), self.eps,
                        residual=residual, offset=self.offset)

    def extra_repr(self) -> str:
        offset = f", offset={self.offset}" if self.offset else ""
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}{offset}")


class GemmaRMSNorm(RMSNorm):
    """transformers' ``Gemma2RMSNorm(dim, eps)``: ``x̂ · (1 + weight)``, weight zeros."""

    def __init__(self, dim: int | Sequence[int], eps: float | None = 1e-6, *,
                 device: Any = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(dim, eps, offset=1.0, device=device, dtype=dtype)


class LayerNorm(nn.Module):
    """``torch.nn.LayerNorm`` (same constructor, attributes and ``state_dict``), with the
    fused residual add (``forward(x, residual)`` returns ``(y, x + residual)``)."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        for name, present in (("weight", elementwise_affine),
                              ("bias", elementwise_affine and bias)):
            # absent ones registered as None, as torch's
            self.register_parameter(name, nn.Parameter(
                torch.empty(self.normalized_shape, **factory)) if present else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, residual: Tensor | None = None
                ) -> Tensor | tuple[Tensor, Tensor]:
        return layer_norm(x, self.normalized_shape, _norm_weight(self.weight, x),
                          _norm_weight(self.bias, x), self.eps, residual=residual)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


def gated_activation_of(name: str, owner: str = "SwiGLUMLP") -> tuple[str, str]:
    """``(op, approximate)`` of a transformers activation name; :class:`Unsupported` when the
    package has no fused gated form of it."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise Unsupported(f"{owner}: activation {name!r} has no fused gated kernel; "
                          f"supported: {sorted(_ACTIVATIONS)}") from None


class SwiGLUMLP(nn.Module):
    """transformers' ``LlamaMLP``: ``down_proj(act(gate_proj(x)) · up_proj(x))`` with the
    activation and product fused in one op (``swiglu``; GeGLU for GELU activations).

    ``SwiGLUMLP(config)`` reads ``hidden_size``, ``intermediate_size``, ``mlp_bias`` and the
    activation (``hidden_activation`` or ``hidden_act``) as transformers does, or give them
    as ``SwiGLUMLP(hidden_size=, intermediate_size=, bias=, activation=)``. Parameter names
    (``gate_proj``, ``up_proj``, ``down_proj``) are transformers', so checkpoints load into
    either module."""

    default_activation = "silu"

    def __init__(self, config: Any = None, hidden_size: int | None = None,
                 intermediate_size: int | None = None, *, bias: bool | None = None,
                 activation: str | None = None, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.config = config
        self.hidden_size = int(hidden_size if hidden_size is not None
                               else config.hidden_size)
        self.intermediate_size = int(intermediate_size if intermediate_size is not None
                                     else config.intermediate_size)
        if bias is None:
            bias = bool(getattr(config, "mlp_bias", False))
        if activation is None:
            activation = (getattr(config, "hidden_activation", None)
                          or getattr(config, "hidden_act", None) or self.default_activation)
        self.activation = activation
        self.gated_op, self.approximate = gated_activation_of(activation,
                                                              type(self).__name__)
        factory = {"bias": bias, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, **factory)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, **factory)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, **factory)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.gated_op == "swiglu":
            hidden = swiglu(gate, up)
        else:
            hidden = geglu(gate, up, approximate=self.approximate)
        return self.down_proj(hidden)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class GeGLUMLP(SwiGLUMLP):
    """transformers' ``Gemma2MLP``: :class:`SwiGLUMLP` with GELU (tanh) as the default
    activation (``config.hidden_activation`` wins when given)."""

    default_activation = "gelu_pytorch_tanh"


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                         position_ids: Tensor | int | None = None,
                         unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb``: ``q·cos + rotate_half(q)·sin`` (and ``k``),
    ``q`` ``[B, Hq, S, D]``, ``k`` ``[B, Hkv, S, D]``, ``cos``/``sin`` ``[B | 1, S, D]``
    (the two halves of the last axis equal, as transformers builds them) in one launch.

    ``unsqueeze_dim=2`` takes ``[B, S, H, D]`` tensors. ``position_ids`` is unused, as in
    transformers (which dropped it: an int there is read as ``unsqueeze_dim``). The tables
    get no gradient (transformers computes them without one)."""
    if isinstance(position_ids, int):
        unsqueeze_dim = position_ids
    layouts = {1: "BHSD", 2: "BSHD", -3: "BHSD", -2: "BSHD"}
    if unsqueeze_dim not in layouts:
        raise Unsupported(f"apply_rotary_pos_emb: unsqueeze_dim = {unsqueeze_dim} must be "
                          "1 ([B, H, S, D]) or 2 ([B, S, H, D])")
    return rope(q, k=k, cos=cos, sin=sin, pairing="half_split",
                layout=layouts[unsqueeze_dim])


def _check_reduction(owner: str, reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise InvalidProblem(f"{owner}: reduction = {reduction!r} must be one of "
                             f"{_REDUCTIONS}")
    return reduction


class CrossEntropyLoss(nn.Module):
    """``torch.nn.CrossEntropyLoss`` (same constructor, ``weight`` buffer and input layouts:
    ``[C]``, ``[N, C]`` or ``[N, C, d1, ...]`` with class-index targets) plus ``z_loss``
    (``+ z · lse²`` per row) and ``softcap`` (``c · tanh(x / c)`` before the softmax)."""

    def __init__(self, weight: Tensor | None = None, size_average: bool | None = None,
                 ignore_index: int = -100, reduce: bool | None = None,
                 reduction: str = "mean", label_smoothing: float = 0.0, *,
                 z_loss: float = 0.0, softcap: float | None = None) -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
        self.register_buffer("weight", weight)
        self.ignore_index = int(ignore_index)
        self.reduction = _check_reduction(type(self).__name__, reduction)
        self.label_smoothing = float(label_smoothing)
        self.z_loss = float(z_loss)
        self.softcap = softcap

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        name = type(self).__name__
        if target.is_floating_point():
            raise Unsupported(f"{name}: target has dtype {target.dtype}; only class-index "
                              "targets (integer dtypes) are supported")
        if input.dim() == 0:
            raise InvalidProblem(f"{name}: input must have rank >= 1 (classes on axis 1, "
                                 "or axis 0 for rank 1)")
        classes = input.shape[0 if input.dim() == 1 else 1]
        logits = input.movedim(1, -1) if input.dim() > 2 else input
        logits = logits.reshape(-1, classes)
        loss = cross_entropy(logits, target.reshape(-1), weight=self.weight,
                             ignore_index=self.ignore_index, reduction=self.reduction,
                             label_smoothing=self.label_smoothing, z_loss=self.z_loss,
                             softcap=self.softcap)
        if self.reduction == "none":
            return loss.reshape(target.shape)
        return loss.reshape(())

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
                f"softcap={self.softcap}")


def _autocast_operands(*tensors: Tensor | None) -> list[Tensor | None]:
    """``tensors`` in the CUDA autocast dtype when autocast is on (the matmul inside the fused
    op would not be autocast by torch), else unchanged."""
    if not torch.is_autocast_enabled("cuda"):
        return list(tensors)
    dtype = torch.get_autocast_dtype("cuda")
    return [t if t is None or t.dtype == dtype else t.to(dtype) for t in tensors]


def linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor,
                         bias: Tensor | None = None, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: float | None = None) -> Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias), target)`` over ``hidden`` ``[..., H]``
    and ``target`` ``[...]`` without the logits, through ``fused_linear_cross_entropy``
    (autocast-aware, see the module docstring); ``reduction="none"`` returns ``target``'s
    shape."""
    _check_reduction("linear_cross_entropy", reduction)
    hidden, weight, bias = _autocast_operands(hidden, weight, bias)
    loss = fused_linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), weight,
                                      target.reshape(-1), bias, ignore_index=ignore_index,
                                      reduction=reduction, label_smoothing=label_smoothing,
                                      z_loss=z_loss, softcap=softcap)
    return loss.reshape(target.shape) if reduction == "none" else loss.reshape(())


class FusedLinearCrossEntropyLoss(nn.Module):
    """``forward(hidden, weight, target, bias=None)`` =
    ``CrossEntropyLoss(...)(F.linear(hidden, weight, bias), target)`` computed chunk by chunk
    of tokens, never holding the ``[tokens, vocab]`` logits (see
    :func:`linear_cross_entropy`). Options as :class:`CrossEntropyLoss` (no class weights)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, *, z_loss: float = 0.0,
                 softcap: float | None = None) -> None:
        super().__init__()
        self.ignore_index = int(ignore_index)
        self.reduction = _check_reduction(type(self).__name__, reduction)
        self.label_smoothing = float(label_smoothing)
        self.z_loss = float(z_loss)
        self.softcap = softcap

    def forward(self, hidden: Tensor, weight: Tensor, target: Tensor,
                bias: Tensor | None = None) -> Tensor:
        return linear_cross_entropy(hidden, weight, target, bias,
                                    ignore_index=self.ignore_index, reduction=self.reduction,
                                    label_smoothing=self.label_smoothing, z_loss=self.z_loss,
                                    softcap=self.softcap)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
                f"softcap={self.softcap}")
