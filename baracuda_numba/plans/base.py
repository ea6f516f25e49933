"""The Plan protocol shared by every op.

``Plan.select(desc, pref)`` validates everything that depends only on the descriptor and
prepares (compiles or loads) the kernel; ``plan.can_implement(args)`` checks concrete
arrays and returns their views; ``plan.run(args, stream=None, workspace=None)`` calls
``can_implement`` and launches on ``stream`` without synchronising. A rejected call
raises before any launch, so nothing is written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, NoReturn, TypeVar

from .. import arrays as arrays_module
from .. import devices
from ..arrays import (
    array_device,
    as_ref,
    contiguous_strides,
    flat_span,
    layout_exec,
    layout_lines,
)
from ..errors import InvalidProblem, Unsupported, WorkspaceTooSmall
from ..streams import stream_device, stream_handle
from ..types import ElementKind, KernelSku, PlanPreference, PrecisionGuarantee

__all__ = ["LAUNCHED", "MAX_RANK", "LayoutMemo", "Plan", "check_devices", "device_checked",
           "fail", "plan_args", "product", "replay_launcher", "store_replay",
           "written_pairs"]

MAX_RANK = 8


def fail(plan: str, exc: type[Exception], arg: str, rule: str) -> NoReturn:
    """Raise ``exc`` with the house format: ``Plan: argument rule``."""
    raise exc(f"{plan}: {arg} {rule}")


_T = TypeVar("_T")


def plan_args(cls: type[_T]) -> type[_T]:
    """``@dataclass(frozen=True, slots=True)`` for a plan's args, with a faster ``__init__``.

    A frozen dataclass assigns each field through ``object.__setattr__``; this
    ``__init__`` calls the slots' own setters (about half the time) and keeps everything
    else: positional and keyword arguments,
    defaults, immutability afterwards, ``repr``/``==``/``hash``. Args are built once per
    ``run`` call, so this is host time of every call.
    """
    cls = dataclass(frozen=True, slots=True)(cls)
    namespace: dict[str, Any] = {}
    params, body = [], []
    for f in fields(cls):
        if f.default_factory is not MISSING:  # type: ignore[misc]
            raise TypeError(f"plan_args: {cls.__name__}.{f.name} uses default_factory")
        namespace[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        if f.default is MISSING:
            params.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})\n")
    source = f"def __init__(self, {', '.join(params)}):\n" + ("".join(body) or "    pass\n")
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[misc]
    return cls


def product(values: tuple[int, ...] | list[int]) -> int:
    result = 1
    for v in values:
        result *= v
    return result


def replay_launcher(calls: list[tuple[Any, tuple[int, ...]]], pointers: tuple[int, ...],
                    within: tuple[int, int] | None = None) -> Any:
    """``launch(stream, *pointers)`` repeating ``calls`` (``(bound launch, its pointer
    arguments)`` as the checked path of a ``run`` made them) for new array pointers: each
    recorded pointer argument must be 0 or one of ``pointers`` (the run's arrays, 0 for an
    absent one), which it then stands for. ``within = (i, nbytes)``: a pointer inside the
    first ``nbytes`` of array ``i`` (a workspace whose parts the launches address) stands
    for that array's pointer plus the same offset. None when that is ambiguous (two arrays
    at one address, or another derived pointer), so the plan stores no memo for the
    layout.

    Generated as one flat function, like :func:`~baracuda_numba.driver.pointer_launcher`:
    a repeated ``run`` pays one frame for the replay and one per launch; a single
    launch is the bound launch's own launcher taking the arrays in this order
    (``BoundLaunch.taking``), one frame in all."""
    present = [p for p in pointers if p]
    if len(set(present)) != len(present):
        return None
    names = {p: f"a{i}" for i, p in enumerate(pointers) if p}
    base, nbytes = within if within is not None and pointers[within[0]] else (0, 0)
    namespace: dict[str, Any] = {}
    body = ""
    for k, (bound, arguments) in enumerate(calls):
        values = []
        for value in arguments:
            if value == 0:
                values.append("0")
            elif value in names:
                values.append(names[value])
            elif nbytes and 0 < value - pointers[base] < nbytes:
                values.append(f"(a{base} + {value - pointers[base]})")
            else:
                return None
        namespace[f"f{k}"] = getattr(bound, "fast", bound)
        body += f"    f{k}(stream, {', '.join(values)})\n"
    if len(calls) == 1 and hasattr(calls[0][0], "taking"):
        direct = calls[0][0].taking(tuple(values), len(pointers))
        if direct is not None:  # one launch: its own launcher takes the arrays
            return direct
    parameters = ", ".join(["stream", *(f"a{i}" for i in range(len(pointers)))])
    exec(f"def launch({parameters}):\n{body or '    pass'}\n", namespace)
    return namespace["launch"]


def written_pairs(count: int, written: tuple[int, ...],
                  same: tuple[tuple[int, int], ...] = ()) -> tuple[tuple[int, int], ...]:
    """The ``LayoutMemo`` disjoint pairs of ``count`` arrays whose ``written`` ones must not
    overlap any other, except the pairs in ``same`` (an output that is its input: in place)."""
    pairs = {(min(o, i), max(o, i)) for o in written for i in range(count) if i != o}
    return tuple(sorted(pairs - {(min(a, b), max(a, b)) for a, b in same}))


def store_replay(memo: LayoutMemo, key: Any, plan: str, names: tuple[str, ...],
                 arrays: tuple[Any, ...], calls: list[tuple[Any, tuple[int, ...]]],
                 aliases: tuple[int, ...] = ()) -> None:
    """Store ``calls`` (what the checked path launched, with their pointer arguments)
    under ``key`` for :func:`replay_launcher`: each later call with this layout replays
    them with its own pointers, its ``arrays`` (named ``names``) tested for the memo's
    disjoint pairs. ``aliases``: arrays that are another of ``arrays`` (in place), whose
    pointer the replay takes from that one. Nothing is stored where a launch pointer is no
    argument's or two arguments share one address."""
    if key is None:
        return
    views = [None if a is None else as_ref(a, plan, name) for a, name in zip(arrays, names)]
    pointers = [0 if v is None or i in aliases else v.ptr for i, v in enumerate(views)]
    launch = replay_launcher(calls, tuple(pointers))
    if launch is not None:
        memo.store(key, launch, tuple(0 if v is None else flat_span(v.shape, v.strides)
                                      * v.itemsize for v in views))


#: What ``LayoutMemo.launch`` returns after it launched.
LAUNCHED = object()


class LayoutMemo:
    """What a plan's checks concluded for one layout of its arrays, so that a repeated
    ``run`` skips them: the fast path of ``run`` for decode-sized calls.

    Built for a plan's number of arrays and the index pairs of arrays that its checks
    require to be disjoint (``disjoint``; re-tested per call, since pointers are not part
    of the key). Two generated functions read the layout key of each array
    (:func:`~baracuda_numba.arrays.layout_signature`: CUDA torch tensors and CuPy arrays;
    shape, strides, dtype, pointer mod 16), add ``extra`` (the plan's own switches) and
    look it up:

    * ``launch(stream, extra, a0, ..., a{n-1})`` (the hot path of ``run``) launches the
      stored function on ``stream`` (normalised by
      :func:`~baracuda_numba.streams.stream_handle`) with the arrays' pointers and
      returns :data:`LAUNCHED`, when the layout was stored and no pair that must be
      disjoint overlaps at these pointers; else it returns the key (None when the arrays
      are not all torch tensors or CuPy arrays). The plan then runs its checked path and
      ``store(key, launch, spans)`` with ``spans`` the byte span of each array.
    * ``lookup(arrays, extra)`` returns ``(key, hit)`` with ``hit`` ``(launch,
      pointers)`` or None, for :meth:`Plan.layout_launch`.

    The stored ``launch(stream_handle, *pointers)`` must do everything the checked path
    would. The disjointness test is generated inline: an array with an empty span
    overlaps nothing at its own address, but one starting inside another's span counts
    as overlapping (the checked path decides those)."""

    __slots__ = ("_entries", "launch", "_find", "_slow", "_promote", "_disjoint", "_tried")

    def __init__(self, arrays: int, disjoint: tuple[tuple[int, int], ...] = ()) -> None:
        self._entries: dict[Any, tuple[Any, tuple[int, ...]]] = {}
        self._disjoint = disjoint
        factory = _MEMO_FACTORIES.get((arrays, disjoint))
        if factory is None:
            factory = _MEMO_FACTORIES[(arrays, disjoint)] = _memo_factory(arrays, disjoint)
        self._promote: list[Any] = [self.make_hot]
        self._tried: set[str] = set()  # frameworks whose hot layout was made or refused
        self.launch, self._find = factory(self._entries, stream_handle, LAUNCHED,
                                          self._promote)
        self._slow = self.launch

    def lookup(self, arrays: tuple[Any, ...], extra: Any = None
               ) -> tuple[Any, tuple[Any, tuple[int, ...]] | None]:
        return self._find(extra, *arrays)

    def store(self, key: Any, launch: Any, spans: tuple[int, ...]) -> None:
        if key is None:
            return
        launch = getattr(launch, "fast", launch)  # a BoundLaunch: its generated launcher
        if len(self._entries) >= 64:
            self._entries.clear()
        self._entries[key] = (launch, spans)

    @property
    def layout_count(self) -> int:
        """How many argument layouts the memo holds (tests: a repeated call adds none)."""
        return len(self._entries)

    @property
    def hot(self) -> bool:
        """Whether ``launch`` tests a hot layout first (:meth:`make_hot`) rather than
        being the dict path it started as (again after :meth:`clear`)."""
        return self.launch is not self._slow

    @property
    def promoting(self) -> bool:
        """Whether a dict hit may still make its layout hot: False once a torch and a
        CuPy layout were each made hot or refused (until :meth:`clear`)."""
        return self._promote[0] is not None

    def clear(self) -> None:
        self._entries.clear()
        self.launch = self._slow
        self._promote[0] = self.make_hot
        self._tried.clear()

    def make_hot(self, key: Any, go: Any, spans: tuple[int, ...], *arrays: Any) -> None:
        """Make ``launch`` test this stored layout (``key``, its launch ``go`` and
        ``spans``, the ``arrays`` it was stored for) first, without building a key; the
        layout test falls back to the ``launch`` in force before.

        Called by the dict path of ``launch`` after a hit, once per framework (until
        ``clear``): a torch layout and a CuPy layout can both be hot, the one made later
        testing first and falling back to the other, then to the dict path. For
        torch tensors the test is one C call: ``TensorGuards`` (the C++ check of
        ``torch.compile``'s guards) compares each tensor's Python type, dispatch keys
        (CUDA among them), dtype, device, ``requires_grad``, sizes and strides with the
        ones given here. For CuPy arrays it compares type, shape, strides and dtype with
        the key's, attribute by attribute, with no tuple to build or hash. Either way the
        hot launcher then compares each pointer's residue mod 16 and runs the
        disjointness test, so a pass implies the key would be equal; anything else
        (another layout, inference mode, a subclass, mixed frameworks) falls back to the
        dict path."""
        present = tuple(a is not None for a in arrays)
        given = [a for a in arrays if a is not None]
        kind = "cupy" if all(type(a) is arrays_module._CUPY_ARRAY for a in given) \
            else "torch" if all(type(a) is arrays_module._TORCH_TENSOR for a in given) \
            else "mixed"
        tried = self._tried
        if kind in tried:
            return
        tried.add(kind)
        if "torch" in tried and "cupy" in tried:
            self._promote[0] = None
        if kind == "mixed":
            return
        dense: tuple[bool, ...] = ()
        if kind == "cupy":
            check = None
            layouts = [k[:3] for k in key[0] if k is not None]
            dense = tuple(_dense(layout, a) for layout, a in zip(layouts, given))
        else:
            guards = _tensor_guards()
            if guards is None:
                return
            try:
                guard = guards(*given, dynamic_dims_sizes=[list(t.shape) for t in given],
                               dynamic_dims_strides=[list(t.stride()) for t in given])
                if not guard.check(*given):
                    return
            except Exception:  # noqa: BLE001 - a torch without this guard: no hot layout
                return
            check, layouts = guard.check, []
        residues = [0 if k is None else k[3] for k in key[0]]
        form = (kind, present, self._disjoint, dense)
        factory = _HOT_FACTORIES.get(form)
        if factory is None:
            factory = _HOT_FACTORIES[form] = _hot_factory(*form)
        self.launch = factory(check, go, key[1], self.launch, stream_handle, LAUNCHED,
                              *spans, *residues, *(v for layout in layouts for v in layout))


_GUARDS: list[Any] = []


def _tensor_guards() -> Any:
    """``torch._C._dynamo.guards.TensorGuards`` if the imported torch has it, else None
    (a private class of ``torch.compile``'s guards, used only as a faster layout test:
    without it every call takes the dict path). Looked up once torch is imported."""
    if _GUARDS:
        return _GUARDS[0]
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        found = torch._C._dynamo.guards.TensorGuards
    except AttributeError:
        found = None
    _GUARDS.append(found)
    return found


_MEMO_FACTORIES: dict[tuple[int, tuple[tuple[int, int], ...]], Callable[..., Any]] = {}


def _memo_factory(n: int, disjoint: tuple[tuple[int, int], ...]) -> Callable[..., Any]:
    """``factory(entries, stream_handle, LAUNCHED, promote) -> (launch, find)`` for
    :class:`LayoutMemo` of ``n`` arrays and these ``disjoint`` pairs; after a stored
    layout launched, ``launch`` calls ``promote[0]`` (while it is not None) with the
    key, the entry and the arrays."""
    names = [f"a{i}" for i in range(n)]
    arguments = ", ".join(names)
    pointers = ", ".join(f"p_{a}" for a in names)
    key = f"    key = (({''.join(f'k_{a}, ' for a in names)}), extra)\n"
    found = ("    entry = entries.get(key)\n"
             "    if entry is None:\n        return {miss}\n"
             "    go, s = entry\n")
    if disjoint:
        found += f"    if not ({_disjoint_test(disjoint, 's[{}]')}):\n        return {{miss}}\n"
    launch = (f"def launch(stream, extra, {arguments}):\n"
              + layout_lines(names, "return None") + key + found.format(miss="key")
              + f"    go({_STREAM}, {pointers})\n"
              "    if promote[0] is not None:\n"
              f"        promote[0](key, go, s, {arguments})\n"
              "    return LAUNCHED\n")
    find = (f"def find(extra, {arguments}):\n"
            + layout_lines(names, "return None, None") + key
            + found.format(miss="key, None")
            + f"    return key, (go, ({pointers},))\n")
    source = ("def factory(entries, stream_handle, LAUNCHED, promote):\n"
              + "".join(f"    {line}\n" for line in (launch + find).splitlines())
              + "    return launch, find\n")
    return layout_exec(source, {})["factory"]


def _disjoint_test(disjoint: tuple[tuple[int, int], ...], span: str) -> str:
    """Python source that is true when no pair ``(i, j)`` of ``disjoint`` overlaps: array
    ``i`` at pointer ``p_a{i}`` spans ``span.format(i)`` bytes. An array with an empty span
    overlaps nothing at its own address, but one starting inside another's span does."""
    return " and ".join(f"(p_a{i} >= p_a{j} + {span.format(j)} or "
                        f"p_a{j} >= p_a{i} + {span.format(i)})" for i, j in disjoint)


_STREAM = "0 if stream is None else stream if type(stream) is int else stream_handle(stream)"
_HOT_FACTORIES: dict[tuple[Any, ...], Callable[..., Any]] = {}


def _dense(layout: tuple[Any, ...], array: Any) -> bool:
    """Whether a CuPy ``layout`` (shape, byte strides, dtype) is the C-contiguous one of
    its shape with every extent at least 2: then an array of that shape and dtype whose
    ``_c_contiguous`` flag is set has exactly these strides, and the hot test reads the
    flag (a plain attribute) instead of ``strides`` (a tuple built per read)."""
    shape, strides, _ = layout
    if not hasattr(array, "_c_contiguous") or any(n < 2 for n in shape):
        return False
    return tuple(strides) == tuple(s * array.itemsize for s in contiguous_strides(shape))


def _hot_factory(kind: str, present: tuple[bool, ...], disjoint: tuple[tuple[int, int], ...],
                 dense: tuple[bool, ...] = ()) -> Callable[..., Any]:
    """``factory(check, go, extra_key, slow, stream_handle, LAUNCHED, *spans, *residues,
    *layouts) -> launch`` for :meth:`LayoutMemo.make_hot`: the memo's ``launch`` for one
    stored layout with the arrays at ``present`` given (the others None), torch tensors
    (``kind`` "torch": ``check(*tensors)`` tests them) or CuPy arrays ("cupy": ``layouts``
    holds each given array's shape, strides and dtype, compared inline; the dtype by
    identity, so an equal but distinct dtype object takes the dict path; where
    ``dense`` is true for a given array, its ``_c_contiguous`` flag stands for its
    strides, see :func:`_dense`). It launches
    ``go`` when ``extra`` equals the stored one, the absent arrays are None, the layout
    test passes, every pointer has its stored residue mod 16 and the ``disjoint`` pairs
    do not overlap; otherwise it returns ``slow(...)`` (the other framework's hot
    launcher, or the dict path)."""
    names = [f"a{i}" for i in range(len(present))]
    given = [a for a, p in zip(names, present) if p]
    tests = [f"{a} is None" for a, p in zip(names, present) if not p]
    if kind == "torch":
        tests.append(f"check({', '.join(given)})")
        pointer = "{a}.data_ptr()"
        layouts = []
    else:
        dense = dense or (False,) * len(given)
        tests += [f"type({a}) is _CUPY_ARRAY and "
                  + (f"{a}._c_contiguous" if flag else f"{a}.strides == t_{a}")
                  + f" and {a}.shape == l_{a} and {a}.dtype is d_{a}"
                  for a, flag in zip(given, dense)]
        pointer = "{a}.data.ptr"
        layouts = [f"{v}_{a}" for a in given for v in "ltd"]
    body = f"    if extra == extra_key and {' and '.join(tests)}:\n"
    body += "".join(f"        p_{a} = {pointer.format(a=a)}\n" if p else f"        p_{a} = 0\n"
                    for a, p in zip(names, present))
    fits = [f"(p_{a} & 15) == m_{a}" for a in given]
    if disjoint:
        fits.append(_disjoint_test(disjoint, "s_a{}"))
    body += (f"        if {' and '.join(fits)}:\n"
             f"            go({_STREAM}, {', '.join(f'p_{a}' for a in names)})\n"
             "            return LAUNCHED\n"
             f"    return slow(stream, extra, {', '.join(names)})\n")
    parameters = ["check", "go", "extra_key", "slow", "stream_handle", "LAUNCHED",
                  *(f"s_{a}" for a in names), *(f"m_{a}" for a in names), *layouts]
    source = (f"def factory({', '.join(parameters)}):\n"
              f"    def launch(stream, extra, {', '.join(names)}):\n"
              + "".join(f"    {line}\n" for line in body.splitlines())
              + "    return launch\n")
    return layout_exec(source, {})["factory"]


#: The methods of a plan that launch: wrapped per plan where several devices are visible.
_RUN_METHODS = ("run", "run_fw", "run_bw")
_ARRAY_FIELDS: dict[type, tuple[str, ...]] = {}


def _named_arrays(args: Any, workspace: Any) -> list[tuple[str, Any]]:
    """``(name, value)`` of every field of a plan's ``args`` (the items of a tuple or list
    field as ``name[i]``) and the workspace; :func:`check_devices` skips what is
    not an array."""
    names = _ARRAY_FIELDS.get(type(args))
    if names is None:
        names = _ARRAY_FIELDS[type(args)] = tuple(f.name for f in fields(args)) \
            if hasattr(args, "__dataclass_fields__") else ()
    found = []
    for name in names:
        value = getattr(args, name)
        if type(value) in (tuple, list):
            found += [(f"{name}[{i}]", item) for i, item in enumerate(value)]
        elif value is not None:
            found.append((name, value))
    if workspace is not None:
        found.append(("workspace", workspace))
    return found


def check_devices(plan: str, arrays: Iterable[tuple[str, Any]], stream: Any,
                  bound: int | None) -> int | None:
    """The one device that every array (``(name, array)`` pairs; non-arrays are skipped)
    and ``stream`` are on, and that is ``bound`` (the plan's device, None: any). Raises
    :class:`~baracuda_numba.errors.InvalidProblem` naming the plan, the arguments and their
    devices otherwise. Returns None where nothing has a device."""
    where: dict[int, list[str]] = {}
    for name, array in arrays:
        device = array_device(array)
        if device is not None:
            where.setdefault(device, []).append(name)
    device = stream_device(stream)
    if device is not None:
        where.setdefault(device, []).append("stream")
    if len(where) > 1:
        listing = "; ".join(f"{', '.join(names)} on device {device}"
                            for device, names in sorted(where.items()))
        raise InvalidProblem(f"{plan}: arrays and stream must be on one device, got "
                             f"{listing}")
    if not where:
        return bound
    (device, names), = where.items()
    if bound is not None and device != bound:
        raise InvalidProblem(
            f"{plan}: {', '.join(names)} on device {device}, but this plan was selected on "
            f"device {bound} (its kernels and device state live there); select one plan "
            "per device")
    return device


def device_checked(plan: Plan, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (a bound ``run``, ``run_fw`` or ``run_bw`` of ``plan``, taking ``(args,
    stream=None, workspace=None)``) behind the several-device check: every array of
    ``args``, the workspace and the stream must be on ``plan.device``
    (:func:`check_devices` raises :class:`InvalidProblem` naming them before
    anything launches), and the call runs with that device's primary context current."""
    name, device = plan.name, plan.device

    def checked(args: Any, stream: Any = None, workspace: Any = None) -> Any:
        check_devices(name, _named_arrays(args, workspace), stream, device)
        with devices.on(device):
            return run(args, stream, workspace)

    checked.__doc__ = run.__doc__
    checked.__wrapped__ = run  # type: ignore[attr-defined]
    return checked


def _device_launch(device: int | None, launch: Callable[..., None] | None
                   ) -> Callable[..., None] | None:
    """``launch`` run with ``device``'s primary context current (``layout_launch``'s
    result where several devices are visible)."""
    if launch is None:
        return None

    def on_device(stream: int, *pointers: int) -> None:
        with devices.on(device):
            launch(stream, *pointers)

    return on_device


class Plan:
    """Base class: holds the descriptor, SKU and workspace size; checks workspaces.

    Where the process sees several devices (:func:`devices.several`), a plan belongs to
    the device current when it was built (:attr:`device`): its ``run`` methods check that
    every array and the stream are on it and launch in its context (see
    :mod:`baracuda_numba.devices`); with one device nothing of this runs."""

    name: ClassVar[str] = "Plan"

    def __init__(self, desc: Any, sku: KernelSku, pref: PlanPreference | None,
                 workspace_size: int = 0) -> None:
        self.descriptor = desc
        self._sku = sku
        self._pref = pref or PlanPreference()
        self._workspace_size = workspace_size
        self._device: int | None = None
        if devices.several():
            self._device = devices.current_device()
            for method in _RUN_METHODS:
                if hasattr(type(self), method):
                    setattr(self, method, device_checked(self, getattr(self, method)))
            layout_launch = self.layout_launch
            self.layout_launch = (  # type: ignore[method-assign]
                lambda args, workspace=None: _device_launch(
                    self._device, layout_launch(args, workspace)))
        if (self._pref.max_workspace_bytes is not None
                and workspace_size > self._pref.max_workspace_bytes):
            fail(self.name, Unsupported, "pref.max_workspace_bytes",
                 f"= {self._pref.max_workspace_bytes} is below the {workspace_size} bytes "
                 "this plan needs")

    @property
    def sku(self) -> KernelSku:
        return self._sku

    @property
    def device(self) -> int | None:
        """The device this plan's kernels, tables and memos belong to (the one current when
        it was selected); None in a process that sees one device (nothing is checked)."""
        return self._device

    @property
    def precision_guarantee(self) -> PrecisionGuarantee:
        return self._sku.precision_guarantee

    @property
    def layout_memos(self) -> tuple[LayoutMemo, ...]:
        """The plan's layout memos (the repeated-call path of ``run``), in the order it
        made them; empty for a plan without one. What tests read (``layout_count``,
        ``hot``)."""
        return tuple(v for v in vars(self).values() if isinstance(v, LayoutMemo))

    @property
    def workspace_size(self) -> int:
        """Bytes of device scratch ``run`` needs (pass a buffer at least this large)."""
        return self._workspace_size

    def layout_launch(self, args: Any, workspace: Any = None) -> Callable[..., None] | None:
        """What a repeated ``run(args, workspace=workspace)`` replays for torch tensors or
        CuPy arrays of these layouts, as ``launch(stream_handle, *pointers)`` with one
        pointer per array field of ``args`` in field order (0 for an absent one), then, for
        a plan that takes a workspace, the workspace's (a workspace of another size or
        layout is another key); None where ``run`` keeps no such launch (a plan without a
        layout memo, other arrays, or a layout not yet run).

        For callers that know more than ``run`` can: the functional API, whose outputs are
        fresh allocations (so no aliasing to check) with a layout that follows from the
        input's, keys the result by the input's layout alone and then skips ``run``'s own
        per-array layout reading."""
        return None

    def check_workspace(self, workspace: Any) -> int:
        """Pointer of a large-enough workspace (0 if none is needed)."""
        if self._workspace_size == 0:
            return 0
        if workspace is None:
            raise WorkspaceTooSmall(f"{self.name}: workspace is None", self._workspace_size, 0)
        view = as_ref(workspace, self.name, "workspace")
        nbytes = view.numel * view.itemsize
        if nbytes < self._workspace_size or not view.is_contiguous():
            raise WorkspaceTooSmall(f"{self.name}: workspace must be a contiguous buffer",
                                    self._workspace_size, nbytes)
        return view.ptr

    @classmethod
    def check_rank(cls, shape: tuple[int, ...], arg: str) -> None:
        """Rank 1..8 (0 is InvalidProblem, > 8 Unsupported) and no negative extents."""
        if len(shape) == 0:
            fail(cls.name, InvalidProblem, arg, "has rank 0; rank must be 1..8")
        if len(shape) > MAX_RANK:
            fail(cls.name, Unsupported, arg, f"has rank {len(shape)}; rank must be 1..8")
        for axis, extent in enumerate(shape):
            if not isinstance(extent, int) or extent < 0:
                fail(cls.name, InvalidProblem, f"{arg}[{axis}]",
                     f"= {extent!r} must be a non-negative int")

    @classmethod
    def check_element(cls, element: Any, supported: tuple[ElementKind, ...] | Any) -> None:
        """``element`` must be one of ``supported`` (Unsupported otherwise)."""
        if not isinstance(element, ElementKind):
            fail(cls.name, InvalidProblem, "element", f"= {element!r} is not an ElementKind")
        if element not in supported:
            names = ", ".join(e.name for e in supported)
            fail(cls.name, Unsupported, "element",
                 f"= {element.name} is not supported (supported: {names})")
