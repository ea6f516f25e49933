"""Array views over any framework's device arrays.

``TensorRef`` (read) and ``TensorMut`` (written) hold a device pointer, a shape, strides
counted in storage elements, the array's typestr and the owning object (kept alive for
the duration of the call). They are built from:

* ``torch.Tensor`` (``data_ptr()``/``stride()``; a tensor with ``requires_grad=True`` is
  read without going through ``__cuda_array_interface__``, which would raise),
* CuPy arrays, Numba device arrays,
* anything exposing ``__cuda_array_interface__`` (v2/v3),
* in the Numba CUDA simulator: NumPy arrays and the simulator's device arrays.

The extractor is chosen once per Python type and cached, so building a view costs a few
attribute reads. bf16 arrays (torch and ml_dtypes export typestr ``<V2``) travel as
16-bit storage; kernels convert to f32 in registers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._runtime import SIMULATOR
from .errors import BufferTooSmall, InvalidProblem, MisalignedOperand, Unsupported
from .types import ElementKind

__all__ = ["TensorMut", "TensorRef", "array_device", "as_mut", "as_ref", "contiguous_strides",
           "flat_span", "layout_exec", "layout_lines", "layout_signature", "pointer_device"]

MAX_RANK = 8

_Extracted = tuple[int, tuple[int, ...], tuple[int, ...] | None, str, int, bool]
# (pointer, shape, strides in elements or None for C-contiguous, typestr, itemsize, readonly)


class _Misaligned(ValueError):
    pass


def _elem_strides(byte_strides: Any, itemsize: int) -> tuple[int, ...] | None:
    if byte_strides is None:
        return None
    strides = tuple(s // itemsize for s in byte_strides)
    if any(s % itemsize for s in byte_strides):
        raise _Misaligned(f"strides {tuple(byte_strides)} (bytes) are not multiples of the "
                          f"item size {itemsize}")
    return strides


class TensorRef:
    """A read-only view: pointer, shape, strides (elements), typestr, owner."""

    __slots__ = ("owner", "ptr", "shape", "strides", "typestr", "itemsize")

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 typestr: str, itemsize: int, owner: Any = None) -> None:
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.typestr = typestr
        self.itemsize = itemsize
        self.owner = owner

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def is_contiguous(self) -> bool:
        """Row-major contiguous (size-1 axes may have any stride)."""
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(ptr=0x{self.ptr:x}, shape={self.shape}, "
                f"strides={self.strides}, typestr={self.typestr!r})")


class TensorMut(TensorRef):
    """A writable view; its strides never make two elements share memory."""

    __slots__ = ()


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in elements, of a dense tensor of ``shape``."""
    strides = []
    step = 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def flat_span(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements between the first and one past the last addressed element (0 if empty)."""
    span = 1
    for extent, stride in zip(shape, strides):
        if extent == 0:
            return 0
        span += (extent - 1) * stride
    return span


# ---------------------------------------------------------------------------------------
# Extraction, cached per Python type.


def _extract_cai(obj: Any) -> _Extracted:
    try:
        cai = obj.__cuda_array_interface__
    except RuntimeError:
        # torch raises for requires_grad=True tensors; read the data without the graph.
        obj = obj.detach()
        cai = obj.__cuda_array_interface__
    ptr, readonly = cai["data"]
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    return (ptr or 0, tuple(cai["shape"]), _elem_strides(cai.get("strides"), itemsize),
            typestr, itemsize, bool(readonly))


_TORCH_TYPESTR: dict[Any, tuple[str, int]] = {}


def _torch_typestr(dtype: Any) -> tuple[str, int]:
    found = _TORCH_TYPESTR.get(dtype)
    if found is None:
        import torch

        table = {
            torch.float16: "<f2", torch.bfloat16: "<V2", torch.float32: "<f4",
            torch.float64: "<f8", torch.int8: "|i1", torch.uint8: "|u1",
            torch.int16: "<i2", torch.int32: "<i4", torch.int64: "<i8",
            torch.bool: "|b1", torch.complex64: "<c8", torch.complex128: "<c16",
        }
        for name in ("uint16", "uint32", "uint64"):
            if hasattr(torch, name):
                table[getattr(torch, name)] = "<u" + str(int(name[4:]) // 8)
        for name in ("float8_e4m3fn", "float8_e5m2"):
            if hasattr(torch, name):
                table[getattr(torch, name)] = "|V1"
        for key, typestr in table.items():
            _TORCH_TYPESTR[key] = (typestr, int(typestr[2:]))
        found = _TORCH_TYPESTR.get(dtype)
        if found is None:
            raise Unsupported(f"torch dtype {dtype} has no element kind")
    return found


def _extract_torch(obj: Any) -> _Extracted:
    if not obj.is_cuda:
        raise InvalidProblem("tensor is on the CPU; a CUDA tensor is required")
    typestr, itemsize = _TORCH_TYPESTR.get(obj.dtype) or _torch_typestr(obj.dtype)
    # torch.Size is a tuple subclass: compares and hashes like the tuple it holds.
    return obj.data_ptr(), obj.shape, obj.stride(), typestr, itemsize, False


def _extract_cupy(obj: Any) -> _Extracted:
    dtype = obj.dtype
    itemsize = dtype.itemsize
    return (obj.data.ptr, obj.shape, _elem_strides(obj.strides, itemsize), dtype.str,
            itemsize, False)


def _extract_numba(obj: Any) -> _Extracted:
    dtype = obj.dtype
    ptr = obj.device_ctypes_pointer.value or 0
    itemsize = dtype.itemsize
    return ptr, obj.shape, _elem_strides(obj.strides, itemsize), dtype.str, itemsize, False


def _extract_numpy(obj: Any) -> _Extracted:  # simulator only: host memory stands in
    dtype = obj.dtype
    itemsize = dtype.itemsize
    return (obj.ctypes.data, obj.shape, _elem_strides(obj.strides, itemsize), dtype.str,
            itemsize, not obj.flags.writeable)


def _extract_fake_cuda(obj: Any) -> _Extracted:  # simulator's device arrays
    return _extract_numpy(obj._ary)


_EXTRACTORS: dict[type, Callable[[Any], _Extracted]] = {}
#: ``torch.Tensor`` once a tensor has been seen (``_view`` inlines its extraction).
_TORCH_TENSOR: type | None = None
#: ``cupy.ndarray`` once a CuPy array has been seen (memo keys, :func:`layout_lines`).
_CUPY_ARRAY: type | None = None


def array_types() -> tuple[type | None, type | None]:
    """``(torch.Tensor, cupy.ndarray)`` as found so far (each None until the first tensor /
    CuPy array went through :func:`as_ref`): the classes that :func:`layout_signature`,
    :func:`layout_lines` and the plans' layout memos take for a torch tensor and a CuPy
    array."""
    return _TORCH_TENSOR, _CUPY_ARRAY


def set_array_types(torch_tensor: type | None, cupy_array: type | None) -> None:
    """Make ``torch_tensor`` / ``cupy_array`` the classes of :func:`array_types`, and have
    :func:`as_ref` read their instances as it reads a torch tensor / CuPy array (a test's
    stand-ins with the attributes those read; restore the pair :func:`array_types` gave
    afterwards). :func:`as_ref` still finds the real classes itself and sets them when it
    first meets one."""
    global _TORCH_TENSOR, _CUPY_ARRAY
    _TORCH_TENSOR, _CUPY_ARRAY = torch_tensor, cupy_array
    for cls, extract in ((torch_tensor, _extract_torch), (cupy_array, _extract_cupy)):
        if cls is not None:
            _EXTRACTORS.setdefault(cls, extract)


def _extractor_for(cls: type, obj: Any) -> Callable[[Any], _Extracted]:
    found = _EXTRACTORS.get(cls)
    if found is not None:
        return found
    module = cls.__module__ or ""
    names = {c.__module__.split(".")[0] + "." + c.__name__ for c in cls.__mro__}
    if "torch.Tensor" in names:
        found = _extract_torch
        if cls.__module__ == "torch" and cls.__name__ == "Tensor":
            global _TORCH_TENSOR
            _TORCH_TENSOR = cls
    elif module.startswith("cupy") and hasattr(cls, "data"):
        found = _extract_cupy
        if cls.__name__ == "ndarray":
            global _CUPY_ARRAY
            _CUPY_ARRAY = cls
    elif SIMULATOR and cls.__name__ == "FakeCUDAArray":
        found = _extract_fake_cuda
    elif SIMULATOR and "numpy.ndarray" in names:
        found = _extract_numpy
    elif module.startswith("numba") and hasattr(cls, "device_ctypes_pointer"):
        found = _extract_numba
    elif hasattr(obj, "__cuda_array_interface__"):
        found = _extract_cai
    else:
        raise TypeError(f"{cls.__name__} is not a device array (no __cuda_array_interface__)")
    _EXTRACTORS[cls] = found
    return found


# ---------------------------------------------------------------------------------------
# Device of an array (several devices in one process: baracuda_numba.devices), read the way
# the array's extractor reads its pointer.


def pointer_device(pointer: int) -> int | None:
    """The device ordinal holding memory at ``pointer`` (the driver's
    ``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL``; None where the driver does not know the
    address). The simulator's "device memory" is host memory: device 0."""
    if SIMULATOR:
        return 0
    from .driver import pointer_device as ordinal

    return ordinal(pointer)


def _interface_device(obj: Any) -> int | None:
    try:
        interface = obj.__cuda_array_interface__
    except RuntimeError:  # torch, requires_grad
        interface = obj.detach().__cuda_array_interface__
    return pointer_device(interface["data"][0] or 0)


def _torch_device(obj: Any) -> int | None:
    index = obj.get_device()
    return None if index < 0 else index


#: extractor -> how that kind of array gives its device
_DEVICE_OF: dict[Callable[[Any], _Extracted], Callable[[Any], int | None]] = {
    _extract_torch: _torch_device,
    _extract_cupy: lambda obj: obj.device.id,
    _extract_numba: lambda obj: pointer_device(obj.device_ctypes_pointer.value or 0),
    _extract_cai: _interface_device,
    _extract_numpy: lambda obj: pointer_device(obj.ctypes.data),
    _extract_fake_cuda: lambda obj: pointer_device(obj._ary.ctypes.data),
}
_DEVICE_READERS: dict[type, Callable[[Any], int | None]] = {}


def _ref_device(ref: TensorRef) -> int | None:
    owner = ref.owner
    if owner is not None and owner is not ref and not isinstance(owner, TensorRef):
        return array_device(owner)
    return pointer_device(ref.ptr)


def _no_device(_obj: Any) -> None:
    return None


def array_device(obj: Any) -> int | None:
    """The device ordinal of ``obj`` (torch: ``get_device()``, CuPy: ``device.id``, a
    :class:`TensorRef`: its owner's, anything else: the device of its pointer); None for
    what is no device array (``None``, numbers, CPU tensors). Chosen once per type."""
    read = _DEVICE_READERS.get(type(obj))
    if read is None:
        cls = type(obj)
        if obj is None:
            read = _no_device
        elif issubclass(cls, TensorRef):
            read = _ref_device
        else:
            try:
                read = _DEVICE_OF[_EXTRACTORS.get(cls) or _extractor_for(cls, obj)]
            except TypeError:  # not a device array
                read = _no_device
        _DEVICE_READERS[cls] = read
    return read(obj)


def _fail(plan: str, arg: str, exc: type[Exception], rule: str) -> Exception:
    return exc(f"{plan}: {arg} {rule}")


# Per kind, the accepted typestrs as a frozenset attribute: a string-keyed set lookup on
# the hot path (hashing an Enum member costs a Python-level call).
for _kind in ElementKind:
    _kind._accepts = frozenset(_kind.typestrs)  # type: ignore[attr-defined]


def _view(cls: type[TensorRef], obj: Any, plan: str, arg: str,
          element: ElementKind | None, expected_shape: tuple[int, ...] | None) -> TensorRef:
    """The hot path of every ``run``: one extractor call, two cached dict lookups and one
    combined test; anything unusual (TensorRef inputs, flat buffers, every failure) goes
    to :func:`_view_checked`, which redoes the checks one by one with their messages."""
    found = _TORCH_TYPESTR.get(obj.dtype) if type(obj) is _TORCH_TENSOR and obj.is_cuda \
        else None
    if found is not None:
        # torch.Tensor inline (the common case: one call and one tuple less per view)
        typestr, itemsize = found
        ptr, shape, strides, readonly = obj.data_ptr(), obj.shape, obj.stride(), False
    elif isinstance(obj, TensorRef):
        return _check_given_view(cls, obj, plan, arg, element, expected_shape)
    else:
        try:
            ptr, shape, strides, typestr, itemsize, readonly = (
                _EXTRACTORS.get(type(obj)) or _extractor_for(type(obj), obj))(obj)
        except _Misaligned as exc:
            raise _fail(plan, arg, MisalignedOperand, str(exc)) from None
        except (TypeError, InvalidProblem, Unsupported) as exc:
            kind = InvalidProblem if isinstance(exc, TypeError) else type(exc)
            raise _fail(plan, arg, kind, f"cannot be used: {exc}") from None
        if strides is None:
            strides = _CONTIGUOUS.get(shape) or _contiguous_cached(shape)
    negative, overlapping = _LAYOUTS.get((shape, strides)) or _layout_facts(shape, strides)
    if (readonly or negative or ptr % itemsize or (overlapping and cls is TensorMut)
            or (element is not None and typestr not in element._accepts)  # type: ignore[attr-defined]
            or (expected_shape is not None and shape != expected_shape)):
        return _view_checked(cls, TensorRef(ptr, shape, strides, typestr, itemsize, obj),
                             readonly, plan, arg, element, expected_shape)
    return cls(ptr, shape, strides, typestr, itemsize, obj)


def _view_checked(cls: type[TensorRef], ref: TensorRef, readonly: bool, plan: str, arg: str,
                  element: ElementKind | None,
                  expected_shape: tuple[int, ...] | None) -> TensorRef:
    if readonly and cls is TensorMut:
        raise _fail(plan, arg, InvalidProblem, "is read-only; an output must be writable")
    if ref.ptr % ref.itemsize:
        raise _fail(plan, arg, MisalignedOperand,
                    f"pointer 0x{ref.ptr:x} is not aligned to its item size {ref.itemsize}")
    ref = cls(ref.ptr, ref.shape, ref.strides, ref.typestr, ref.itemsize, ref.owner)
    return _check_given_view(cls, ref, plan, arg, element, expected_shape)


def _check_given_view(cls: type[TensorRef], ref: TensorRef, plan: str, arg: str,
                      element: ElementKind | None,
                      expected_shape: tuple[int, ...] | None) -> TensorRef:
    if cls is TensorMut and not isinstance(ref, TensorMut):
        raise _fail(plan, arg, InvalidProblem, "is a read-only TensorRef; an output needs "
                    "a writable array")
    if element is not None and ref.typestr not in element._accepts:  # type: ignore[attr-defined]
        raise _wrong_element(ref, plan, arg, element)
    if expected_shape is not None and ref.shape != expected_shape:
        ref = _as_flat_buffer(cls, ref, plan, arg, expected_shape)
    _check_layout(cls, ref, plan, arg)
    return ref


def _wrong_element(ref: TensorRef, plan: str, arg: str, element: ElementKind) -> Exception:
    return _fail(plan, arg, InvalidProblem,
                 f"has typestr {ref.typestr!r}, which does not hold element {element.name} "
                 f"(accepted: {', '.join(element.typestrs)})")


_CONTIGUOUS: dict[tuple[int, ...], tuple[int, ...]] = {}


def _contiguous_cached(shape: tuple[int, ...]) -> tuple[int, ...]:
    found = _CONTIGUOUS.get(shape)
    if found is None:
        if len(_CONTIGUOUS) > 4096:
            _CONTIGUOUS.clear()
        found = _CONTIGUOUS[shape] = contiguous_strides(shape)
    return found


def _check_layout(cls: type[TensorRef], ref: TensorRef, plan: str, arg: str) -> None:
    """Strides must be non-negative; an output's must not make elements overlap."""
    negative, overlapping = _layout_facts(ref.shape, ref.strides)
    if negative:
        raise _fail(plan, arg, Unsupported, f"has negative strides {ref.strides}")
    if overlapping and cls is TensorMut:
        raise _fail(plan, arg, InvalidProblem,
                    f"strides {ref.strides} for shape {ref.shape} make elements overlap; an "
                    "output must not alias itself")


def _as_flat_buffer(cls: type[TensorRef], ref: TensorRef, plan: str, arg: str,
                    expected_shape: tuple[int, ...]) -> TensorRef:
    """A 1-D contiguous array stands for a dense buffer of ``expected_shape`` (as upstream's
    device slices do) if it holds enough elements; any other shape is a mismatch."""
    if len(ref.shape) == 1 and (ref.shape[0] <= 1 or ref.strides[0] == 1) and \
            len(expected_shape) != 1:
        needed = 1
        for extent in expected_shape:
            needed *= extent
        if ref.shape[0] < needed:
            raise BufferTooSmall(f"{plan}: {arg} is a flat buffer of {ref.shape[0]} elements, "
                                 f"too small for shape {expected_shape}", needed, ref.shape[0])
        return cls(ref.ptr, expected_shape, contiguous_strides(expected_shape), ref.typestr,
                   ref.itemsize, ref.owner)
    raise _fail(plan, arg, InvalidProblem,
                f"has shape {ref.shape}, but the descriptor requires {expected_shape}")


_LAYOUTS: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[bool, bool]] = {}


def _layout_facts(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[bool, bool]:
    """(has a negative stride, may address one element twice), cached per layout.

    The overlap test is sufficient, not necessary: sorted by stride, each axis's stride
    must reach past everything the smaller axes address."""
    key = (shape, strides)
    found = _LAYOUTS.get(key)
    if found is None:
        negative = any(s < 0 for s in strides)
        # An empty array addresses nothing (NumPy 2 gives empty arrays zero strides).
        empty = any(e == 0 for e in shape)
        axes = [] if empty else sorted((abs(s), e) for e, s in zip(shape, strides) if e > 1)
        reach = 1
        overlapping = False
        for stride, extent in axes:
            if stride < reach:
                overlapping = True
                break
            reach = stride * extent
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        found = _LAYOUTS[key] = (negative, overlapping)
    return found


def as_ref(obj: Any, plan: str, arg: str, element: ElementKind | None = None,
           shape: tuple[int, ...] | None = None) -> TensorRef:
    """A read view of ``obj``; checks its typestr against ``element`` and its shape."""
    return _view(TensorRef, obj, plan, arg, element, shape)


def as_mut(obj: Any, plan: str, arg: str, element: ElementKind | None = None,
           shape: tuple[int, ...] | None = None) -> TensorMut:
    """A write view of ``obj``: also rejects read-only arrays and self-overlapping strides."""
    return _view(TensorMut, obj, plan, arg, element, shape)  # type: ignore[return-value]


def layout_signature(arrays: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[int]] | None:
    """``(layout key, pointers)`` when every array (``None`` allowed) is a CUDA
    ``torch.Tensor`` or a CuPy array, else None: the memo key of a plan's fast ``run``.

    The key holds every fact the array checks of ``can_implement`` depend on except the
    pointer values themselves: shape, strides and dtype of each array and its pointer
    modulo 16 (alignment, which also picks vector widths). A plan may cache what its
    checks concluded under this key; checks that compare pointers (aliasing between
    operands) must still run per call. Torch and CuPy keys never compare equal (their
    dtypes differ). None until the first tensor or CuPy array went through :func:`as_ref`
    (which finds their classes without importing torch or CuPy).

    Host time of every memo-path ``run``: one generated function per number of arrays
    (no loop, no list building) reads 5 attributes of each tensor (4 of a CuPy array);
    :func:`layout_lines` is that code, for callers that generate their own functions."""
    signature = _SIGNATURES.get(len(arrays))
    if signature is None:
        signature = _SIGNATURES[len(arrays)] = _make_signature(len(arrays))
    return signature(*arrays)


_SIGNATURES: dict[int, Callable[..., Any]] = {}


def layout_lines(names: list[str], miss: str, indent: str = "    ") -> str:
    """Python source that sets ``k_<name>`` (the array's layout key, None for None) and
    ``p_<name>`` (its pointer, 0 for None) for each of ``names``, or runs ``miss`` (a
    statement, e.g. ``return None``) when one is neither None, a CUDA ``torch.Tensor``
    nor a CuPy array. Compile it with :func:`layout_exec`."""
    lines = []
    for a in names:
        lines += [f"if {a} is None:", f"    k_{a} = None", f"    p_{a} = 0",
                  f"elif type({a}) is _TORCH_TENSOR and {a}.is_cuda:",
                  f"    p_{a} = {a}.data_ptr()",
                  f"    k_{a} = ({a}.shape, {a}.stride(), {a}.dtype, p_{a} & 15)",
                  f"elif type({a}) is _CUPY_ARRAY:",
                  f"    p_{a} = {a}.data.ptr",
                  f"    k_{a} = ({a}.shape, {a}.strides, {a}.dtype, p_{a} & 15)",
                  "else:", f"    {miss}"]
    return "".join(f"{indent}{line}\n" for line in lines)


def layout_exec(source: str, names: dict[str, Any]) -> dict[str, Any]:
    """Execute generated ``source`` whose functions use :func:`layout_lines`: their
    globals are this module's (so they see the torch and CuPy classes once found);
    returns the namespace holding what ``source`` defined, with ``names`` given."""
    namespace = dict(names)
    exec(compile(source, "<layout signature>", "exec"), globals(), namespace)
    return namespace


def _make_signature(n: int) -> Callable[..., Any]:
    """``signature(a0, ..., a{n-1})`` for :func:`layout_signature`."""
    names = [f"a{i}" for i in range(n)]
    keys = "".join(f"k_{a}, " for a in names)
    source = (f"def signature({', '.join(names)}):\n"
              + layout_lines(names, "return None")
              + f"    return ({keys}), [{', '.join(f'p_{a}' for a in names)}]\n")
    return layout_exec(source, {})["signature"]
