"""What every functional op shares: the bounded plan and call-site caches, output
allocation with the input's framework, the current-stream source and the layout-keyed
fast launch of torch call sites; axis helpers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import devices
from .._frameworks import allocator, device_token, element_of, framework_of, stream_source
from ..arrays import array_device
from ..errors import InvalidProblem
from ..types import ElementKind

__all__ = ["BoundedCache", "Site", "cache_info", "call_site", "clear_plan_cache", "drop_dim",
           "fast_launch", "keepdim_shape", "normalize_dim", "plan_for", "workspace_spec"]

_CACHE_SIZE = 1024


class BoundedCache:
    """A bounded, thread-safe map filled on demand: ``get(key, make)`` returns the cached
    value or stores ``make()``; past ``size`` entries the oldest insertion is dropped.
    Hits take no lock (one ``dict.get``)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._values: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.peek = self._values.get  # the value or None; never fills

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        value = self._values.get(key)
        if value is None:
            value = make()
            with self._lock:
                self._values[key] = value
                if len(self._values) > self._size:
                    self._values.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[Any]:
        return list(self._values)


_plans = BoundedCache(_CACHE_SIZE)  # (family, descriptor fields) -> plan
_sites = BoundedCache(_CACHE_SIZE)  # (family, options, array type, shape, dtype, device) -> Site


def plan_for(key: Any, make: Callable[[], Any], like: Any = None) -> Any:
    """The cached plan for ``key``; ``make()`` selects it on a miss (bounded cache).

    Where several devices are visible a plan belongs to one device: the key then holds
    the device (``like``'s, the input array; else the current one, which
    :func:`call_site` makes the input's) and the plan is selected on it."""
    if devices.several():
        device = devices.current_device() if like is None else array_device(like)
        select = make

        def make() -> Any:
            with devices.on(device):
                return select()

        key = (key, device)
    return _plans.get(key, make)


def clear_plan_cache() -> None:
    _plans.clear()
    _sites.clear()


def cache_info() -> dict[str, Any]:
    """What the functional layer holds: ``plans`` (cached plans), ``sites`` (call sites)
    and ``launches`` (per torch call site, how many input layouts keep a direct launch)."""
    sites = [_sites.peek(key) for key in list(_sites.keys())]
    return {"plans": len(_plans), "sites": len(sites),
            "launches": [len(s.launches) for s in sites if s is not None and s.launches]}


class Site(NamedTuple):
    """What a call with given options and input layout facts needs besides ``run``: the
    plan, output allocators (``alloc(input)``; ``None`` where there is no such output) and
    the framework's
    current-stream source; ``axis`` is the normalised ``dim`` (reductions)."""

    plan: Any
    outputs: tuple[Callable[[Any], Any] | None, ...]
    stream: Callable[[], Any]
    axis: int = 0
    #: torch inputs: input layout -> ``plan.layout_launch`` (see :func:`_fast_launch`)
    launches: dict[Any, Any] | None = None


def call_site(x: Any, options: tuple[Any, ...],
          make: Callable[[tuple[int, ...], ElementKind], tuple[Any, tuple, int]]) -> Site:
    """The call site of ``options`` with input ``x``: on a miss, ``make(shape, element)``
    returns ``(plan, ((shape, element) | None, ...) per output, axis)``. Keyed by what
    decides plan and allocation: the options, the array type, shape, dtype and device."""
    key = (options, type(x), x.shape, x.dtype, device_token(x))
    site = _sites.peek(key)
    if site is not None:
        return site

    def build() -> Site:
        # Several devices: the plan is selected on the input's device (whatever the
        # current one is), and its run launches there (Plan.device).
        with devices.on(array_device(x) if devices.several() else None):
            plan, outputs, axis = make(tuple(int(s) for s in x.shape), element_of(x))
        allocs = tuple(None if spec is None else allocator(x, *spec) for spec in outputs)
        return Site(plan, allocs, stream_source(x), axis,
                     {} if framework_of(x) == "torch" else None)

    return _sites.get(key, build)


def fast_launch(launches: dict[Any, Any], layout: Any, plan: Any, args: Any,
                workspace: Any = None) -> None:
    """Keep ``plan.layout_launch(args, workspace)`` (after a checked ``run(args,
    workspace=workspace)``) under ``layout``: the input's strides and the pointers'
    alignment (mod 16) of every array (the workspace's too, where the plan takes one:
    a fresh allocation of the size the plan asks for, its pointer passed last).

    The call site already fixes the input's type, shape, dtype and device, and every
    output is a fresh allocation whose layout follows from the input's (``empty_like``
    keeps a dense input's strides; anything else comes out contiguous): so this key
    decides everything ``run``'s checks look at, and a fresh output cannot overlap the
    input, which is all ``run``'s per-call aliasing checks would see. A repeated call
    then launches with the new pointers and skips the args object and ``run``'s reading
    of every array's layout (the figures: docs/design/launch.md)."""
    launch = plan.layout_launch(args, workspace)
    if launch is not None:
        if len(launches) >= 64:
            launches.clear()
        launches[layout] = launch


def normalize_dim(dim: int, rank: int, fn: str) -> int:
    if not -rank <= dim < max(rank, 1):
        raise InvalidProblem(f"{fn}: dim = {dim} is out of range for rank {rank}")
    return dim % max(rank, 1)


def drop_dim(array: Any, dim: int) -> Any:
    """``array`` (keepdim) with axis ``dim`` (extent 1) removed, as a view."""
    shape = tuple(array.shape)
    new_shape = shape[:dim] + shape[dim + 1:]
    if hasattr(array, "squeeze") and not hasattr(array, "copy_to_host"):
        return array.squeeze(dim) if shape[dim] == 1 else array.reshape(new_shape)
    return array.reshape(new_shape)


def keepdim_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + (1,) + shape[axis + 1:]


def workspace_spec(plan: Any) -> tuple[tuple[int], ElementKind] | None:
    """The workspace spec of ``plan`` (bytes, allocated per call with the input's
    framework), None if it needs none."""
    size = plan.workspace_size
    return ((size,), ElementKind.U8) if size else None
