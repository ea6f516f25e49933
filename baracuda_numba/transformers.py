"""Hugging Face ``transformers`` models on the package's fused ops, in one call.

>>> from baracuda_numba.transformers import apply_to_llama
>>> apply_to_llama()                      # before the model is built: patches the module
>>> model = LlamaForCausalLM(config)      # ... or apply_to_llama(model) on a built one

What is replaced (each switch is a keyword of ``apply_to_<arch>``):

* ``rms_norm``: every ``<Arch>RMSNorm`` by :class:`~baracuda_numba.torch.nn.RMSNorm`
  (Gemma-2: :class:`~baracuda_numba.torch.nn.GemmaRMSNorm`, ``x̂ · (1 + w)``);
* ``swiglu``: every ``<Arch>MLP`` by :class:`~baracuda_numba.torch.nn.SwiGLUMLP` (the
  activation and product fused: SwiGLU, or GeGLU-tanh for Gemma-2);
* ``rope``: the modeling module's ``apply_rotary_pos_emb`` (q and k in one launch);
* ``cross_entropy``: the ``<Arch>ForCausalLM`` loss (transformers' ``ForCausalLMLoss``:
  labels shifted by one, ``ignore_index``, mean or ``sum / num_items_in_batch``) by one
  computed with ``baracuda_numba.torch.cross_entropy`` on the logits as they are (no f32
  copy);
* ``fused_linear_cross_entropy``: in training mode with ``labels``, ``<Arch>ForCausalLM``'s
  forward computes the loss from the last hidden states and ``lm_head`` chunk by chunk
  without the logits (``logits`` is then None; Gemma-2's final logit soft-capping goes
  into the fused op); otherwise the original forward runs.

``model=None`` patches the modeling module (``transformers.models.<arch>.modeling_<arch>``):
models built afterwards use the package's modules. With a model, its modules are converted
in place (each module's class is swapped; its parameters, buffers and hooks stay, so an
optimiser built before keeps working) and the loss is set on that model only (a model
other than ``<Arch>ForCausalLM`` gets no loss patch); ``rope``
always patches the modeling module (transformers' attention looks the function up there).

Every attribute is checked before anything changes: an unknown architecture, or a
transformers version whose modules differ from what the patch expects (a class or function
missing, a constructor with other arguments, a model without the modules), raises
:class:`~baracuda_numba.errors.Unsupported` naming what is missing, and nothing is patched.
Each call returns a :class:`Patch`; ``patch.undo()`` (or leaving ``with apply_to_llama():``)
restores everything it changed.

transformers is an optional dependency (``pip install baracuda-numba[transformers]``),
imported when a patch is applied.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidProblem, Unsupported

__all__ = ["ARCHITECTURES", "Architecture", "Patch", "apply", "apply_to_gemma2",
           "apply_to_llama", "apply_to_mistral", "apply_to_model", "apply_to_qwen2",
           "causal_lm_loss"]


@dataclass(frozen=True)
class Architecture:
    """Where a transformers architecture keeps what the patch replaces."""

    name: str  # transformers' ``model_type``
    prefix: str  # class-name prefix in the modeling module
    norm_offset: float = 0.0  # Gemma: x̂ · (1 + w)
    #: config attribute of the final logit soft-capping (None: the model has none)
    softcap_attr: str | None = None

    @property
    def module_name(self) -> str:
        return f"transformers.models.{self.name}.modeling_{self.name}"

    @property
    def names(self) -> dict[str, str]:
        """The modeling module's names the patch touches, by role."""
        p = self.prefix
        return {"rms_norm": f"{p}RMSNorm", "mlp": f"{p}MLP", "rope": "apply_rotary_pos_emb",
                "causal_lm": f"{p}ForCausalLM", "pretrained": f"{p}PreTrainedModel"}


#: The supported architectures, by transformers' ``config.model_type``.
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("llama", "Llama"),
    Architecture("qwen2", "Qwen2"),
    Architecture("mistral", "Mistral"),
    Architecture("gemma2", "Gemma2", norm_offset=1.0, softcap_attr="final_logit_softcapping"),
)}

_MISSING = object()
#: the last value not from this package seen of every (object, attribute) the patches
#: replace: what a later patch of an already patched module checks and wraps
_ORIGINALS: dict[tuple[int, str], Any] = {}


@dataclass
class Patch:
    """What one ``apply_to_<arch>`` call changed, to be undone in reverse order."""

    architecture: str
    #: (object, attribute, previous value or a missing marker)
    attributes: list[tuple[Any, str, Any]] = field(default_factory=list)
    #: (module, previous class, previous ``__dict__`` entries that the swap changed)
    modules: list[tuple[Any, type, dict[str, Any]]] = field(default_factory=list)

    def set(self, target: Any, name: str, value: Any) -> None:
        """``setattr(target, name, value)``, remembering the value in ``vars(target)``."""
        self.attributes.append((target, name, vars(target).get(name, _MISSING)))
        setattr(target, name, value)

    def swap(self, module: Any, cls: type, attrs: dict[str, Any]) -> None:
        saved = {name: module.__dict__.get(name, _MISSING) for name in attrs}
        saved.update({name: module.__dict__[name] for name in _SHADOWED if
                      name in module.__dict__})
        self.modules.append((module, type(module), saved))
        for name in _SHADOWED:
            module.__dict__.pop(name, None)
        module.__class__ = cls
        for name, value in attrs.items():
            object.__setattr__(module, name, value)

    @property
    def changed(self) -> int:
        """How many attributes and modules the patch changed."""
        return len(self.attributes) + len(self.modules)

    def undo(self) -> None:
        """Restore everything this patch changed (idempotent)."""
        for module, cls, saved in reversed(self.modules):
            module.__class__ = cls
            for name, value in saved.items():
                if value is _MISSING:
                    module.__dict__.pop(name, None)
                else:
                    module.__dict__[name] = value
        for target, name, previous in reversed(self.attributes):
            if previous is _MISSING:
                if name in vars(target):
                    delattr(target, name)
            else:
                setattr(target, name, previous)
        self.modules.clear()
        self.attributes.clear()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


#: instance attributes of transformers' modules that the package's classes define as
#: properties (removed on the swap so the property answers, restored by undo)
_SHADOWED = ("variance_epsilon",)


def _import(module_name: str, arch: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise Unsupported(f"apply_to_{arch}: cannot import {module_name} ({error}); "
                          "install transformers: pip install baracuda-numba[transformers]"
                          ) from None


def _original(target: Any, name: str) -> Any:
    """``target.name`` as it was before this package patched it (missing: ``_MISSING``)."""
    key = (id(target), name)
    value = getattr(target, name, _MISSING)
    if value is _MISSING or _ours(value):
        return value if value is _MISSING else _ORIGINALS.get(key, value)
    _ORIGINALS[key] = value
    return value


def _ours(value: Any) -> bool:
    return getattr(value, "__module__", "").startswith("baracuda_numba")


def _parameters(fn: Any) -> list[str]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    return [p for p in params if p != "self"]


def _check_module(arch: Architecture, module: Any, want: dict[str, bool],
                  missing: list[str]) -> dict[str, Any]:
    """The original objects the enabled switches replace; what is absent or different goes
    to ``missing``."""
    names = arch.names
    found: dict[str, Any] = {}
    needed = ["pretrained"] + [role for role in ("rms_norm", "mlp", "rope") if want[role]]
    if want["cross_entropy"] or want["fused_linear_cross_entropy"]:
        needed.append("causal_lm")
    for role in needed:
        value = _original(module, names[role])
        if value is _MISSING:
            missing.append(f"{module.__name__}.{names[role]}")
        else:
            found[role] = value
    rules = {  # role -> (the arguments' rule, which function has them)
        "rms_norm": (lambda p: len(p) >= 2 and p[1] == "eps", "__init__"),
        "mlp": (lambda p: p == ["config"], "__init__"),
        "rope": (lambda p: p[:4] == ["q", "k", "cos", "sin"], None),
    }
    for role, (rule, method) in rules.items():
        if role in found:
            params = _parameters(getattr(found[role], method) if method else found[role])
            if not rule(params):
                missing.append(f"{module.__name__}.{names[role]} with the arguments this "
                               f"patch expects (found {tuple(params)})")
    if "causal_lm" in found:
        forward = getattr(found["causal_lm"], "forward", None)
        params = _parameters(forward)
        for name in ("labels", "logits_to_keep"):
            if name not in params:
                missing.append(f"{module.__name__}.{names['causal_lm']}.forward argument "
                               f"{name!r}")
        from transformers.modeling_utils import PreTrainedModel
        if not isinstance(inspect.getattr_static(PreTrainedModel, "loss_function", None),
                          property):
            missing.append("transformers.modeling_utils.PreTrainedModel.loss_function "
                           "(a property)")
    return found


def _eps_of(norm: Any) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(norm, name, None)
        if isinstance(value, float | int):
            return float(value)
    return None


def _activation(config: Any) -> str | None:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)


def _instances(model: Any, cls: Any) -> Iterator[Any]:
    return (m for m in model.modules() if type(m) is cls)


def _check_model(arch: Architecture, model: Any, found: dict[str, Any], want: dict[str, bool],
                 missing: list[str]) -> None:
    import torch

    if not isinstance(model, torch.nn.Module) or (
            "pretrained" in found and not isinstance(model, found["pretrained"])):
        missing.append(f"a {arch.prefix} model (got {type(model).__name__}: use "
                       "apply_to_model to pick the architecture from model.config)")
        return
    for role, what in (("rms_norm", "weight and eps"), ("mlp", "gate/up/down_proj Linear")):
        if not want[role] or role not in found:
            continue
        originals = list(_instances(model, found[role]))
        if not originals and not any(_ours(type(m)) for m in model.modules()):
            missing.append(f"a {found[role].__name__} module in the model")
        for module in originals:
            if not _convertible(role, module, torch.nn):
                missing.append(f"{type(module).__name__} modules with a {what}")
                break


def _convertible(role: str, module: Any, nn: Any) -> bool:
    if role == "rms_norm":
        return isinstance(getattr(module, "weight", None), nn.Parameter) and (
            _eps_of(module) is not None)
    return all(isinstance(getattr(module, name, None), nn.Linear)
               for name in ("gate_proj", "up_proj", "down_proj"))


def _swap_norms(patch: Patch, model: Any, original: type, arch: Architecture) -> None:
    from .torch.nn import GemmaRMSNorm, RMSNorm

    cls = GemmaRMSNorm if arch.norm_offset else RMSNorm
    for norm in list(_instances(model, original)):
        patch.swap(norm, cls, {"normalized_shape": tuple(norm.weight.shape),
                               "eps": _eps_of(norm), "offset": arch.norm_offset,
                               "elementwise_affine": True})


def _mlp_class(arch: Architecture) -> type:
    from .torch.nn import GeGLUMLP, SwiGLUMLP

    return GeGLUMLP if arch.name == "gemma2" else SwiGLUMLP


def _swap_mlps(patch: Patch, model: Any, original: type, arch: Architecture) -> None:
    from .torch.nn import gated_activation_of

    cls = _mlp_class(arch)
    activation = _activation(model.config) or cls.default_activation
    op, approximate = gated_activation_of(activation)
    for mlp in list(_instances(model, original)):
        patch.swap(mlp, cls, {
            "config": model.config, "hidden_size": mlp.gate_proj.in_features,
            "intermediate_size": mlp.gate_proj.out_features, "activation": activation,
            "gated_op": op, "approximate": approximate})


def causal_lm_loss(logits: Any, labels: Any, vocab_size: int,
                   num_items_in_batch: Any = None, ignore_index: int = -100,
                   shift_labels: Any = None, **kwargs: Any) -> Any:
    """transformers' ``ForCausalLMLoss`` on ``baracuda_numba.torch.cross_entropy``."""
    from .torch import nn as ours

    target = _shifted(labels, shift_labels, ignore_index).to(logits.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = ours.cross_entropy(logits.reshape(-1, vocab_size), target,
                              ignore_index=ignore_index, reduction=reduction)
    return _normalised(loss, num_items_in_batch)


def _shifted(labels: Any, shift_labels: Any, ignore_index: int) -> Any:
    """Token ``t``'s target is label ``t + 1`` (the last one ``ignore_index``), flattened."""
    if shift_labels is None:
        import torch.nn.functional as F

        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return shift_labels.reshape(-1)


def _normalised(loss: Any, num_items_in_batch: Any) -> Any:
    loss = loss.reshape(())
    if num_items_in_batch is None:
        return loss
    import torch

    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


#: keyword arguments of the CausalLM forward that only the loss reads
_LOSS_KWARGS = ("num_items_in_batch", "shift_labels", "ignore_index")


def _fused_forward(original: Callable[..., Any], softcap_attr: str | None
                   ) -> Callable[..., Any]:
    """A ``<Arch>ForCausalLM.forward`` that, in training mode with ``labels`` given as a
    keyword, computes the loss with the fused linear cross-entropy and returns no logits;
    any other call runs ``original``."""

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        # positional arguments past position_ids differ between transformers versions
        keep = kwargs.get("logits_to_keep", 0)
        if (not self.training or kwargs.get("labels") is None or len(args) > 3
                or not isinstance(keep, int)):
            return original(self, *args, **kwargs)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        from .torch.nn import linear_cross_entropy

        labels = kwargs.pop("labels")
        kwargs.pop("logits_to_keep", None)
        return_dict = kwargs.pop("return_dict", None)
        loss_kwargs = {name: kwargs.pop(name) for name in _LOSS_KWARGS if name in kwargs}
        outputs = self.model(*args, **kwargs)
        hidden = outputs.last_hidden_state
        ignore_index = loss_kwargs.get("ignore_index", -100)
        target = _shifted(labels, loss_kwargs.get("shift_labels"), ignore_index)
        if keep:
            hidden = hidden[:, -keep:, :]
            target = target.reshape(labels.shape[0], -1)[:, -keep:]
        num_items = loss_kwargs.get("num_items_in_batch")
        softcap = getattr(self.config, softcap_attr, None) if softcap_attr else None
        loss = linear_cross_entropy(hidden, self.lm_head.weight, target.to(hidden.device),
                                    self.lm_head.bias, ignore_index=ignore_index,
                                    reduction="sum" if num_items is not None else "mean",
                                    softcap=softcap)
        extra = {name: getattr(outputs, name, None) for name in
                 CausalLMOutputWithPast.__dataclass_fields__ if name not in ("loss", "logits")}
        result = CausalLMOutputWithPast(loss=_normalised(loss, num_items), logits=None,
                                        **extra)
        return result.to_tuple() if return_dict is False else result

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward.__doc__ = original.__doc__
    forward.__name__ = "forward"
    return forward


def apply(architecture: str, model: Any = None, *, rope: bool = True, rms_norm: bool = True,
          swiglu: bool = True, cross_entropy: bool = True,
          fused_linear_cross_entropy: bool = False) -> Patch:
    """Patch ``architecture`` (a key of :data:`ARCHITECTURES`) as the module docstring says;
    ``apply_to_<arch>`` are this with the architecture named."""
    arch = ARCHITECTURES.get(architecture)
    if arch is None:
        raise Unsupported(f"apply: architecture {architecture!r} is not supported; "
                          f"supported: {sorted(ARCHITECTURES)}")
    want = {"rope": rope, "rms_norm": rms_norm, "mlp": swiglu, "cross_entropy": cross_entropy,
            "fused_linear_cross_entropy": fused_linear_cross_entropy}
    module = _import(arch.module_name, arch.name)
    import transformers

    missing: list[str] = []
    found = _check_module(arch, module, want, missing)
    config = getattr(model, "config", None)
    if model is not None:
        _check_model(arch, model, found, want, missing)
    if swiglu and "mlp" in found:
        from .torch.nn import gated_activation_of

        activation = _activation(config) if config is not None else None
        if activation is not None:
            try:
                gated_activation_of(activation, f"apply_to_{arch.name}")
            except Unsupported as error:
                missing.append(str(error))
    if missing:
        raise Unsupported(f"apply_to_{arch.name}: transformers {transformers.__version__} "
                          "does not have what the patch expects, nothing was patched; "
                          "missing: " + "; ".join(missing))
    patch = Patch(arch.name)
    try:
        _patch(patch, arch, module, found, want, model)
    except BaseException:
        patch.undo()
        raise
    return patch


def _patch(patch: Patch, arch: Architecture, module: Any, found: dict[str, Any],
           want: dict[str, bool], model: Any) -> None:
    from .torch import nn as ours

    names = arch.names
    if want["rope"]:
        patch.set(module, names["rope"], ours.apply_rotary_pos_emb)
    is_causal_lm = model is None or isinstance(model, found.get("causal_lm", ()))
    loss_target = found.get("causal_lm") if model is None else model
    if model is None:
        if want["rms_norm"]:
            patch.set(module, names["rms_norm"],
                      ours.GemmaRMSNorm if arch.norm_offset else ours.RMSNorm)
        if want["mlp"]:
            patch.set(module, names["mlp"], _mlp_class(arch))
    else:
        if want["rms_norm"]:
            _swap_norms(patch, model, found["rms_norm"], arch)
        if want["mlp"]:
            _swap_mlps(patch, model, found["mlp"], arch)
    if not is_causal_lm or loss_target is None:
        return  # the loss switches concern <Arch>ForCausalLM only
    if want["cross_entropy"]:
        value = staticmethod(causal_lm_loss) if model is None else causal_lm_loss
        patch.set(loss_target, "_loss_function", value)
    if want["fused_linear_cross_entropy"]:
        original = found["causal_lm"].forward
        forward = _fused_forward(original, arch.softcap_attr)
        if model is None:
            patch.set(loss_target, "forward", forward)
        else:
            patch.set(model, "forward", forward.__get__(model))


def apply_to_model(model: Any, **switches: bool) -> Patch:
    """:func:`apply` with the architecture read from ``model.config.model_type``."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None:
        raise InvalidProblem(f"apply_to_model: model ({type(model).__name__}) has no "
                             "config.model_type")
    return apply(model_type, model, **switches)


def apply_to_llama(model: Any = None, *, rope: bool = True, rms_norm: bool = True,
                   swiglu: bool = True, cross_entropy: bool = True,
                   fused_linear_cross_entropy: bool = False) -> Patch:
    """Llama (2, 3, 3.x): RMSNorm, SwiGLU MLP, RoPE, causal-LM loss."""
    return apply("llama", model, rope=rope, rms_norm=rms_norm, swiglu=swiglu,
                 cross_entropy=cross_entropy,
                 fused_linear_cross_entropy=fused_linear_cross_entropy)


def apply_to_qwen2(model: Any = None, *, rope: bool = True, rms_norm: bool = True,
                   swiglu: bool = True, cross_entropy: bool = True,
                   fused_linear_cross_entropy: bool = False) -> Patch:
    """Qwen2 / Qwen2.5: as :func:`apply_to_llama`."""
    return apply("qwen2", model, rope=rope, rms_norm=rms_norm, swiglu=swiglu,
                 cross_entropy=cross_entropy,
                 fused_linear_cross_entropy=fused_linear_cross_entropy)


def apply_to_mistral(model: Any = None, *, rope: bool = True, rms_norm: bool = True,
                     swiglu: bool = True, cross_entropy: bool = True,
                     fused_linear_cross_entropy: bool = False) -> Patch:
    """Mistral: as :func:`apply_to_llama`."""
    return apply("mistral", model, rope=rope, rms_norm=rms_norm, swiglu=swiglu,
                 cross_entropy=cross_entropy,
                 fused_linear_cross_entropy=fused_linear_cross_entropy)


def apply_to_gemma2(model: Any = None, *, rope: bool = True, rms_norm: bool = True,
                    swiglu: bool = True, cross_entropy: bool = True,
                    fused_linear_cross_entropy: bool = False) -> Patch:
    """Gemma-2: ``(1 + w)`` RMSNorm (all four per layer), GeGLU-tanh MLP (``swiglu``
    switches it), RoPE, loss; with ``fused_linear_cross_entropy`` the final logit
    soft-capping runs inside the fused op."""
    return apply("gemma2", model, rope=rope, rms_norm=rms_norm, swiglu=swiglu,
                 cross_entropy=cross_entropy,
                 fused_linear_cross_entropy=fused_linear_cross_entropy)
