"""megatron/cpu_compat.py: a scope that answers Megatron-Core's CUDA spellings on CPU.

    test_scope_shims_cuda_and_restores_it         inside: "cpu" devices, no-op streams, the
                                                  function mode; after: torch.cuda's own six
                                                  functions, no mode, CUDA factories fail again
    test_scope_restores_after_an_exception        an error inside still undoes everything
    test_nested_scopes_restore_at_the_outermost   inner exits leave the shims in place
    test_type_names_cuda_only_for_megatron        Tensor.type() answers Megatron, not others
    test_noop_when_cuda_is_available              the contract on a GPU machine: nothing changes

No Megatron class is patched here or in the module; the GPU branch is reached by reporting
CUDA available (torch.cuda.is_available), which is what the module asks.
"""

from __future__ import annotations

import pytest
import torch

from ufp4_megatron.megatron import cpu_compat

NAMES = ("current_device", "Stream", "Event", "current_stream", "stream", "synchronize")
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the shims act only on a machine without CUDA"
)


def _functions() -> dict:
    return {name: getattr(torch.cuda, name) for name in NAMES}


def _modes() -> int:
    return torch._C._len_torch_function_stack()


def _cuda_factory_fails() -> bool:
    try:
        torch.zeros(1, device="cuda")
    except (AssertionError, RuntimeError):  # "Torch not compiled with CUDA enabled"
        return True
    return False


def test_scope_shims_cuda_and_restores_it():
    before, modes = _functions(), _modes()
    assert _cuda_factory_fails() and not cpu_compat.active()
    with cpu_compat.cpu_compat() as shimmed:
        assert shimmed is True and cpu_compat.active()
        assert all(getattr(torch.cuda, n) is not before[n] for n in NAMES)
        assert torch.cuda.current_device() == "cpu"
        assert torch.empty(3, device=torch.cuda.current_device()).device.type == "cpu"
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.ones(2, device=0).device.type == "cpu"
        t = torch.arange(4.0)
        assert t.cuda() is t
        stream = torch.cuda.Stream()
        assert torch.cuda.current_stream() == stream
        with torch.cuda.stream(stream):
            stream.wait_stream(torch.cuda.current_stream())
        torch.cuda.Event().record()
        torch.cuda.synchronize()
        assert _modes() == modes + 1
    assert _functions() == before
    assert _modes() == modes
    assert _cuda_factory_fails() and not cpu_compat.active()


def test_scope_restores_after_an_exception():
    before, modes = _functions(), _modes()
    with pytest.raises(KeyError, match="inside"), cpu_compat.cpu_compat():
        raise KeyError("inside")
    assert _functions() == before and _modes() == modes and not cpu_compat.active()


def test_nested_scopes_restore_at_the_outermost():
    before, modes = _functions(), _modes()
    with cpu_compat.cpu_compat():
        with cpu_compat.cpu_compat() as inner:
            assert inner is True and _modes() == modes + 1  # one mode, not one per scope
        assert cpu_compat.active() and torch.cuda.current_device() == "cpu"
        assert torch.zeros(1, device="cuda").device.type == "cpu"
    assert _functions() == before and _modes() == modes


def test_type_names_cuda_only_for_megatron():
    t = torch.zeros(1)
    megatron_frame = {"__name__": "megatron.core.optimizer.optimizer"}
    with cpu_compat.cpu_compat():
        assert t.type() == "torch.FloatTensor"  # asked from a test module
        asked = eval("t.type()", megatron_frame, {"t": t})
        assert asked == "torch.cuda.FloatTensor"
    assert eval("t.type()", megatron_frame, {"t": t}) == "torch.FloatTensor"


def test_noop_when_cuda_is_available(monkeypatch):
    before, modes = _functions(), _modes()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with cpu_compat.cpu_compat() as shimmed:
        assert shimmed is False and not cpu_compat.active()
        assert _functions() == before and _modes() == modes
        assert _cuda_factory_fails()  # no device='cuda' redirection either
    assert cpu_compat.enable_cpu_compat() is False
    assert _functions() == before and _modes() == modes and not cpu_compat.active()
