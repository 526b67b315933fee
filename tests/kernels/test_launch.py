"""kernels/launch.py: the cached launch's key and the arguments it hands the launcher.

test_spec_is_at_least_as_fine_as_tritons   two arguments of one class of ours always get
    one specialization from Triton's own native_specialize_impl (else a cached kernel
    compiled for one could run the other)
test_a_hit_launches_with_every_parameter_in_signature_order   a stand-in kernel (the
    real launcher needs a GPU: gpu/kernels_exact.sh runs every kernel test through it,
    as it is on by default)
test_a_new_specialization_compiles_again
test_the_plain_path_where_caching_is_off
test_it_is_on_unless_turned_off   and a bad UFP4_CACHED_LAUNCH says what to give
"""

from __future__ import annotations

import inspect

import pytest
import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

from ufp4_megatron.kernels import launch as L


def _tritons(a):
    return native_specialize_impl(BaseBackend, a, False, True, True)


def test_spec_is_at_least_as_fine_as_tritons():
    ints = [
        0,
        1,
        2,
        15,
        16,
        17,
        31,
        32,
        48,
        2**31 - 16,
        2**31 - 1,
        2**31,
        2**31 + 16,
        2**40,
        2**63 - 16,
        2**63 - 1,
        2**63,
        2**63 + 16,
        2**64 - 16,
        -1,
        -16,
        -17,
        -(2**31),
        -(2**31) - 1,
        -(2**31) - 16,
    ]
    base = {
        dt: torch.zeros(64, dtype=dt)
        for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int32)
    }
    tensors = [t[k:] for t in base.values() for k in (0, 1, 2, 4, 8)]
    values = [*ints, *tensors, 0.5, 1.0, -3.0, True, False, None]  # (numpy ints: Triton refuses)
    classes: dict = {}
    for v in values:
        classes.setdefault(L._spec(v), []).append(v)
    assert len(classes) > 8  # the check below would pass trivially for one class per value
    for cls, members in classes.items():
        theirs = {_tritons(v) for v in members}
        assert len(theirs) == 1, (cls, members, theirs)
    # and the classes really split what Triton splits: 16 vs 17, 1 vs 2, an aligned view
    assert L._spec(16) != L._spec(17) and L._spec(1) != L._spec(2)
    assert L._spec(base[torch.float32]) != L._spec(base[torch.float32][1:])


class _Param:
    def __init__(self, name, constexpr=False, default=inspect.Parameter.empty):
        self.name, self.is_constexpr, self.default = name, constexpr, default
        self.has_default = default is not inspect.Parameter.empty


class _Compiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self):
        self.runs = []

    def run(self, *a):
        self.runs.append(a)


class _Kernel:
    """Stands in for a JITFunction: x, n positional; BLOCK, FLAG=False constexprs."""

    params = [_Param("x"), _Param("n"), _Param("BLOCK", True), _Param("FLAG", True, False)]  # noqa: RUF012 - as JITFunction.params

    def __init__(self):
        self.compiles, self.compiled = [], []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.compiles.append((grid, args, kwargs))
            self.compiled.append(_Compiled())
            return self.compiled[-1]

        return run


@pytest.fixture
def cached(monkeypatch):
    monkeypatch.setattr(L, "ENABLED", True)
    monkeypatch.setattr(L, "SUPPORTED", True)
    monkeypatch.setattr(L, "_cache", {})
    monkeypatch.setattr(L, "_cuda", lambda: True)  # the stand-in driver below is the device

    class Active:
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device: 1234)

    class Driver:
        active = Active()

    monkeypatch.setattr(L, "driver", Driver())


def test_a_hit_launches_with_every_parameter_in_signature_order(cached):
    k, x = _Kernel(), torch.zeros(32)
    L.launch(k, (4,), x, 32, BLOCK=16, num_warps=4)
    assert len(k.compiles) == 1 and k.compiled[0].runs == []  # the miss compiled and ran it
    L.launch(k, (5, 2), x, 48, BLOCK=16, num_warps=4)  # 48: same class as 32
    assert len(k.compiles) == 1
    assert k.compiled[0].runs == [(5, 2, 1, 1234, "fn", "meta", None, None, None, x, 48, 16, False)]


def test_a_new_specialization_compiles_again(cached):
    k, x = _Kernel(), torch.zeros(64)
    calls = [
        ((x, 32), {"BLOCK": 16}),
        ((x, 33), {"BLOCK": 16}),  # not divisible by 16
        ((x, 1), {"BLOCK": 16}),  # Triton makes a 1 a constexpr
        ((x[1:], 32), {"BLOCK": 16}),  # a misaligned view
        ((x.half(), 32), {"BLOCK": 16}),  # another dtype
        ((x, 32), {"BLOCK": 32}),  # another constexpr
        ((x, 32), {"BLOCK": 16, "FLAG": True}),
        ((x, 32), {"BLOCK": 16, "num_warps": 8}),
    ]
    for args, kw in calls:
        L.launch(k, (1,), *args, **kw)
    assert len(k.compiles) == len(calls)
    for args, kw in calls:  # each again: all hits
        L.launch(k, (1,), *args, **kw)
    assert len(k.compiles) == len(calls)
    assert [len(c.runs) for c in k.compiled] == [1] * len(calls)


def test_the_plain_path_where_caching_is_off(cached, monkeypatch):
    k, x = _Kernel(), torch.zeros(16)
    for _ in range(2):  # a constexpr passed positionally: its value is not in the key
        L.launch(k, (1,), x, 16, 16)
    assert len(k.compiles) == 2 and all(c.runs == [] for c in k.compiled)
    hook = lambda metadata: None
    L.knobs.runtime.launch_exit_hook.add(hook)
    try:
        for _ in range(2):  # a profiler's hook must see every launch
            L.launch(k, (1,), x, 16, BLOCK=16)
    finally:
        L.knobs.runtime.launch_exit_hook.remove(hook)
    assert len(k.compiles) == 4
    L.launch(k, (1,), x, 16, BLOCK=16)  # the chains empty again: cached from here on
    L.launch(k, (1,), x, 16, BLOCK=16)
    assert len(k.compiles) == 5 and len(k.compiled[-1].runs) == 1
    monkeypatch.setattr(L.knobs.runtime, "launch_enter_hook", lambda metadata: None)
    L.launch(k, (1,), x, 16, BLOCK=16)  # a plain callable counts as set
    assert len(k.compiles) == 6
    monkeypatch.setattr(L, "ENABLED", False)
    for _ in range(2):
        L.launch(k, (1,), x, 16, BLOCK=16)
    assert len(k.compiles) == 8
    monkeypatch.setattr(L, "ENABLED", True)
    monkeypatch.setattr(L, "_cuda", lambda: False)  # no CUDA driver: sm90_compile.py's case
    monkeypatch.setattr(L, "driver", None)  # (the cached path would ask it for the device)
    for _ in range(2):
        L.launch(k, (1,), x, 16, BLOCK=16)
    assert len(k.compiles) == 10


def test_it_is_on_unless_turned_off():
    import os
    import subprocess
    import sys

    probe = "from ufp4_megatron.kernels import launch; print(launch.ENABLED)"
    for value, want in ((None, "True"), ("1", "True"), ("0", "False"), ("yes", None)):
        env = {k: v for k, v in os.environ.items() if k != "UFP4_CACHED_LAUNCH"}
        if value is not None:
            env["UFP4_CACHED_LAUNCH"] = value
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
        )
        if want is None:  # a value that is neither: refused, saying what to give
            assert out.returncode != 0
            assert "UFP4_CACHED_LAUNCH='yes': give 1" in out.stderr, out.stderr[-2000:]
        else:
            assert out.stdout.strip() == want, out.stderr[-2000:]


def test_an_unhashable_argument_takes_tritons_path(cached):
    k = _Kernel()
    for _ in range(2):
        L.launch(k, (1,), [1, 2], 16, BLOCK=16)
    assert len(k.compiles) == 2 and L._cache == {}
