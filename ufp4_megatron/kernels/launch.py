"""Kernel launches with Triton's per-call binding done once per specialization.

`kernel[grid](*args, **kw)` spends most of its host time before the launch itself: Triton
binds all parameters into a dict, specializes each (dtype, 16-byte alignment, an int equal
to 1 or divisible by 16), builds its cache key from all of them and looks the kernel up,
on every call. For the pair kernel (70 parameters) that Python path measures ~30 us per
call on a CPU core against ~13 us for the key below; the launch proper (CompiledKernel.run)
measured 12.8 us on an H200 (docs/performance.md, "Host cost per call").

`launch` keys the compiled kernel by everything Triton's key depends on: the kernel, the
device, Triton's debug and instrumentation knobs, the keyword arguments (constexprs and
options such as num_warps) and, per positional argument, a specialization at least as fine
as Triton's (`_spec`; tests/kernels/test_launch.py checks it against Triton's own
native_specialize_impl), so one key never stands for two compiled kernels. A miss goes
through `kernel[grid]` (compiling exactly as Triton would) and keeps the CompiledKernel it
returns; a hit calls that kernel's launcher directly with every parameter in signature
order, as JITFunction.run does, without the launch metadata and the empty hook chains
(the launcher skips hooks passed as None).

On by default; UFP4_CACHED_LAUNCH=0 turns it off (Triton's own path for every launch). On a
GPU the CUDA kernel suite runs through it (`bash gpu/kernels_exact.sh`, among them
tests/kernels/test_launch_gpu.py's cache hits, bit for bit), and `gpu/host_overhead.py
--only cached` shows identical outputs and 19-108 us less host time per quantize()/ops call.
The launcher's argument list is Triton 3.6's (runtime/jit.py JITFunction.run). Always off on
other Triton versions, in Triton's CPU interpreter, without a CUDA driver, while a launch
hook is set (a profiler's), and for a kernel called with a constexpr positionally.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.interpreter import InterpretedFunction


def _enabled_from_env() -> bool:
    # a wrong value fails here, at import, for a library user; the trainer refuses it at its
    # start (train/validate.py check_machine), before the kernels are imported
    value = os.environ.get("UFP4_CACHED_LAUNCH", "1")
    if value not in ("0", "1"):
        raise ValueError(
            f"UFP4_CACHED_LAUNCH={value!r}: give 1 (cached kernel launches, the "
            "default) or 0 (Triton's own launch path for every call)"
        )
    return value == "1"


ENABLED = _enabled_from_env()
SUPPORTED = triton.__version__.split(".")[:2] == ["3", "6"]
MAX_ENTRIES = 4096  # layouts change with shapes; never grow without bound
# Every kernel compiles without floating-point contraction: Triton lets the backend fuse a
# multiply and the add it feeds into one fma (one rounding instead of two), which the
# references never do. Where the product is exact the two agree; where it is not, they
# part: RHT's multiply by 1/H rounds on subnormal inputs, and fused into the butterfly's
# first add it gave other bits than the reference (tests/kernels/test_quantize_triton.py,
# the subnormal row of the special values). Explicit tl.fma calls are unaffected.
OPTIONS = {"enable_fp_fusion": False}

_cache: dict = {}
_UNCACHEABLE = (None, None, None)


def _spec(a):
    """A positional argument's class for the key: at least as fine as Triton's
    specialization (tensors: dtype, 16-byte alignment; ints: equal to 1, divisible by 16,
    32-bit, below 2^63; floats, bools, None: their type, which Triton does not specialize
    on; anything else, e.g. a numpy integer: its value)."""
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    t = type(a)
    if t is int:
        return a == 1, a % 16 == 0, -(2**31) <= a < 2**31, a < 2**63
    if t is float or t is bool or a is None:
        return t
    return t, a


def _tail(kernel, n_positional: int, kwargs: dict):
    """The values of the parameters after the positional ones, in signature order (keyword
    or default), or None when a positional argument is a constexpr (its value would have to
    be in the key, which only holds its class)."""
    params = kernel.params
    if any(p.is_constexpr for p in params[:n_positional]):
        return None
    tail = []
    for p in params[n_positional:]:
        if p.name in kwargs:
            tail.append(kwargs[p.name])
        elif p.has_default:
            tail.append(p.default)
        else:  # Triton refused this call already; never reached
            return None
    return tuple(tail)


def _hooked() -> bool:
    """Whether a launch hook would run: Triton 3.6 keeps them in (normally empty) HookChains
    and calls them around every launch; a plain callable counts as set."""
    return any(
        h is not None and getattr(h, "calls", True)
        for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    )


def _key(kernel, device, args: tuple, kwargs: dict) -> tuple:
    """What a compiled kernel is cached under (module docstring). id: a JITFunction hashes
    its source's sha256 under a lock; the entry keeps the kernel alive, so its id is not
    reused while the entry exists."""
    return (
        id(kernel),
        device,
        knobs.runtime.debug,
        knobs.compilation.instrumentation_mode,
        tuple(kwargs.items()),
        tuple(map(_spec, args)),
    )


@functools.cache
def _cuda() -> bool:
    """Whether a CUDA driver is there to ask for the current device: tests/kernels/
    sm90_compile.py drives real JIT kernels on a machine without one, to intercept their
    first launch at Triton's own JITFunction.run and compile it for sm_90."""
    return torch.cuda.is_available()


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """kernel[grid](*args, **kwargs), with Triton's binding skipped after the first call of
    a specialization (module docstring). OPTIONS apply unless the call overrides them."""
    kwargs = {**OPTIONS, **kwargs}
    if (
        not (ENABLED and SUPPORTED)
        or isinstance(kernel, InterpretedFunction)
        or _hooked()
        or not _cuda()
    ):
        kernel[grid](*args, **kwargs)
        return
    device = driver.active.get_current_device()
    key = _key(kernel, device, args, kwargs)
    try:
        hit = _cache.get(key)
    except TypeError:  # an unhashable argument: Triton's own path
        kernel[grid](*args, **kwargs)
        return
    if hit is None:
        compiled = kernel[grid](*args, **kwargs)
        if hasattr(compiled, "result"):  # an asynchronous compile's future
            compiled = compiled.result()
        tail = _tail(kernel, len(args), kwargs)
        if len(_cache) >= MAX_ENTRIES:
            _cache.clear()
        _cache[key] = _UNCACHEABLE if tail is None else (compiled, tail, kernel)
        return
    compiled, tail, _ = hit
    if compiled is None:
        kernel[grid](*args, **kwargs)
        return
    g = (*grid, 1, 1)
    compiled.run(
        g[0],
        g[1],
        g[2],
        driver.active.get_current_stream(device),
        compiled.function,
        compiled.packed_metadata,
        None,
        None,
        None,
        *args,
        *tail,
    )


_NEVER = (None,)  # Prepared: this site's launches always take `launch` (cache off)


class Prepared:
    """kernel[grid](*args, **kwargs) at one launch site whose kernel, grid, keyword arguments
    and argument classes (`_spec`: dtypes and alignment of tensors, classes of ints) are the
    same at every call: the caller keys its Prepared by them (dispatch.PairLaunch). The first
    call launches through `launch` (compiling as Triton would) and keeps the compiled kernel
    of its key; later calls go to that kernel's launcher directly, without computing even
    launch's key. Once `ready`, a pointer argument may also be a raw device address (an int):
    the launcher reads a tensor's data_ptr() and an int alike, so a caller can point at an
    element of a tensor without building a view. Where `launch` would not cache (module
    docstring: off, interpreter, no driver) every call takes `launch`; while a launch hook
    is set, too."""

    __slots__ = ("_hit", "grid", "kernel", "kwargs")

    def __init__(self, kernel, grid: tuple, kwargs: dict):
        self.kernel, self.grid, self.kwargs = kernel, tuple(grid), {**OPTIONS, **kwargs}
        self._hit = None  # (compiled, tail, padded grid, device); _NEVER: uncacheable

    @property
    def ready(self) -> bool:
        """Whether calls go to the compiled kernel's launcher (raw addresses allowed)."""
        return self._hit is not None and self._hit is not _NEVER and not _hooked()

    def __call__(self, *args) -> None:
        hit = self._hit
        if hit is None or hit is _NEVER or _hooked():
            launch(self.kernel, self.grid, *args, **self.kwargs)
            if hit is None:
                self._hit = self._lookup(args)
            return
        compiled, tail, g, device = hit
        compiled.run(
            g[0],
            g[1],
            g[2],
            driver.active.get_current_stream(device),
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *args,
            *tail,
        )

    def _lookup(self, args: tuple):
        """After the first launch: what `launch` cached for it, or _NEVER."""
        if (
            not (ENABLED and SUPPORTED)
            or isinstance(self.kernel, InterpretedFunction)
            or not _cuda()
        ):
            return _NEVER
        device = driver.active.get_current_device()
        try:
            entry = _cache.get(_key(self.kernel, device, args, self.kwargs))
        except TypeError:
            return _NEVER
        if entry is None or entry[0] is None:
            return _NEVER
        return entry[0], entry[1], (*self.grid, 1, 1), device
