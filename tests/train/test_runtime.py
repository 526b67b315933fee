"""train/runtime.py: device, dtype, process group, optimizer and checkpoint form, decided once.

The machine is an input of `decide(cfg, cuda=...)`, so both columns of the table run here.

    test_decision_table                      one row per (config, machine): the Runtime's fields
    test_runtime_is_frozen                   a decision cannot be edited after the fact
    test_decide_asks_this_machine_by_default cuda=None: torch.cuda.is_available()
    test_what_cannot_run_here_is_refused     one line naming the key to change, per case
    test_trainer_refuses_nccl_on_cpu         the same through the real CLI: exit 2, one line
    test_resolve_device_names_the_callers_key   the demo's --device uses the same table
    test_cpu_scope_is_cpu_compat             scope() on CPU: the shims, undone on exit
    test_gpu_scope_changes_nothing           scope() of a GPU runtime touches no torch.cuda
    test_init_outside_the_cpu_scope_is_refused   distributed.init says what is missing
    test_trainer_restores_torch_cuda         a whole CPU run in one process, torch.cuda after
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from _cli import FAST, run

from ufp4_megatron.train.runtime import (
    Runtime,
    decide,
    fused_adam_library,
    resolve_device,
)
from ufp4_megatron.train.schema import (
    CheckpointConfig,
    Config,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
)

CUDA_NAMES = ("current_device", "Stream", "Event", "current_stream", "stream", "synchronize")
CPU, GPU = torch.device("cpu"), torch.device("cuda")


def _cfg(
    device="auto",
    dtype="auto",
    backend="auto",
    pp=1,
    distributed_optimizer=True,
    fully_reshardable=False,
    adam_kernel="auto",
) -> Config:
    return Config(
        model=ModelConfig(),
        # the weight cache given, not sized: auto would size it from the model (left unset
        # here) on this machine's GPU where it has one (test_graph_options.py sizes it)
        train=TrainConfig(device=device, dtype=dtype, weight_cache="all"),
        optim=OptimConfig(adam_kernel=adam_kernel),
        parallel=ParallelConfig(
            pp=pp, backend=backend, distributed_optimizer=distributed_optimizer
        ),
        checkpoint=CheckpointConfig(optim_fully_reshardable=fully_reshardable),
    )


TABLE = [  # (machine has CUDA, config keys, expected Runtime fields)
    (
        False,
        {},
        dict(
            device=CPU,
            dtype=torch.float32,
            backend="gloo",
            distributed_optimizer=True,
            optim_sharding="dp_reshardable",
        ),
    ),
    (False, dict(device="cpu", dtype="fp32"), dict(device=CPU, dtype=torch.float32)),
    (False, dict(dtype="bf16"), dict(device=CPU, dtype=torch.bfloat16, backend="gloo")),
    (False, dict(backend="gloo"), dict(backend="gloo")),
    (
        True,
        {},
        dict(
            device=GPU,
            dtype=torch.bfloat16,
            backend="nccl",
            distributed_optimizer=True,
            optim_sharding="dp_reshardable",
        ),
    ),
    (True, dict(device="cuda", dtype="fp32"), dict(device=GPU, dtype=torch.float32)),
    (True, dict(backend="gloo"), dict(device=GPU, backend="gloo")),
    (True, dict(pp=2), dict(device=GPU, backend="nccl")),  # Megatron's 1F1B
    (
        False,
        dict(distributed_optimizer=False),
        dict(distributed_optimizer=False, optim_sharding=None),
    ),
    (
        False,
        dict(distributed_optimizer=False, fully_reshardable=True),  # no such state to shard
        dict(distributed_optimizer=False, optim_sharding=None),
    ),
    (
        False,
        dict(fully_reshardable=True),
        dict(distributed_optimizer=True, optim_sharding="fully_reshardable"),
    ),
    (
        True,
        dict(dtype="bf16", fully_reshardable=True),
        dict(dtype=torch.bfloat16, optim_sharding="fully_reshardable"),
    ),
    # the Adam kernel; the installed FusedAdam library is the third input (None: neither)
    (False, {}, dict(adam="torch_fused")),
    (True, {}, dict(adam="torch_fused")),
    (True, dict(adam_kernel="fused"), dict(adam="torch_fused")),
    (True, dict(adam_kernel="foreach"), dict(adam="torch_foreach")),
    (True, dict(adam_kernel="auto", library="te"), dict(adam="te_fused")),
    (True, dict(adam_kernel="fused", library="apex"), dict(adam="apex_fused")),
]


@pytest.mark.parametrize(
    "cuda,keys,expected", TABLE, ids=[f"{'cuda' if c else 'cpu'}-{k}" for c, k, _ in TABLE]
)
def test_decision_table(cuda, keys, expected):
    keys = dict(keys)
    library = keys.pop("library", None)
    rt = decide(_cfg(**keys), cuda=cuda, adam_library=library)
    got = {name: getattr(rt, name) for name in expected}
    assert got == expected
    assert rt.checkpoint_format == "torch_dist"  # one file format on GPU and CPU
    assert rt.on_gpu == (rt.device.type == "cuda")
    assert rt.saves_cuda_rng == rt.on_gpu
    assert rt.collective_device == (GPU if rt.backend == "nccl" else CPU)


def test_runtime_is_frozen():
    rt = decide(_cfg(), cuda=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rt.device = GPU


def test_decide_asks_this_machine_by_default():
    from _config import typed_default

    rt = decide(typed_default("model=tiny"))  # a whole config: on a GPU the cache is sized
    assert rt.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert (
        rt.adam
        == {None: "torch_fused", "te": "te_fused", "apex": "apex_fused"}[fused_adam_library()]
    )


@pytest.mark.parametrize("adam", ["torch_fused", "torch_foreach"])
def test_select_adam_kernel_sets_torchs_own_switch(adam):
    """What Megatron-Core builds without TE/Apex (torch AdamW, no kernel flag) gets the decided
    kernel; a step then runs it, its 'step' where torch's own kernel keeps it."""
    from ufp4_megatron.train.optim import select_adam_kernel

    p = torch.nn.Parameter(torch.randn(8))
    inner = torch.optim.AdamW([p], lr=1e-2)
    wrapper = type("MegatronOptimizerLike", (), {"optimizer": inner})()
    select_adam_kernel(wrapper, adam)
    fused = adam == "torch_fused"
    assert all(g["fused"] is fused and g["foreach"] is not fused for g in inner.param_groups)
    p.grad = torch.ones(8)
    inner.step()
    assert inner.state[p]["step"].dtype == torch.float32 and float(inner.state[p]["step"]) == 1


def test_fused_and_foreach_adam_agree():
    """torch's fused AdamW is the same update as its foreach one (up to float rounding)."""
    from ufp4_megatron.train.optim import select_adam_kernel

    ps = {}
    for adam in ("torch_fused", "torch_foreach"):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(256))
        start = p.detach().clone()
        inner = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.1)
        select_adam_kernel(type("W", (), {"optimizer": inner})(), adam)
        for i in range(5):
            p.grad = torch.sin(torch.arange(256.0) * (i + 1))
            inner.step()
        ps[adam] = p.detach()
        assert (ps[adam] - start).abs().min() > 1e-3  # every element was updated
    torch.testing.assert_close(ps["torch_fused"], ps["torch_foreach"], rtol=1e-6, atol=1e-7)


REFUSED = [  # (machine has CUDA, config keys, fragments of the one-line message)
    (
        False,
        dict(device="cuda"),
        ("train.device=cuda but no CUDA device is visible here", "use train.device=auto or cpu"),
    ),
    (
        True,
        dict(device="cpu"),
        (
            "train.device=cpu but a CUDA device is visible here",
            "use train.device=auto",
            "CUDA_VISIBLE_DEVICES=",
        ),
    ),
    (False, dict(pp=2), ("parallel.pp=2 runs on GPU only", "use parallel.pp=1 on CPU")),
    (
        False,
        dict(backend="nccl"),
        ("parallel.backend=nccl needs GPU tensors", "use parallel.backend=auto or gloo"),
    ),
    (False, dict(backend="nccl", dtype="bf16"), ("parallel.backend=nccl",)),
    (True, dict(dtype="fp16"), ("train.dtype='fp16'; valid: auto, bf16, fp32",)),
    (False, dict(device="tpu"), ("train.device='tpu'; valid: auto, cpu, cuda",)),
    (True, dict(backend="mpi"), ("parallel.backend='mpi'; valid: auto, nccl, gloo",)),
    (True, dict(adam_kernel="apex"), ("optim.adam_kernel='apex'; valid: auto, fused, foreach",)),
    (
        True,
        dict(adam_kernel="foreach", library="te"),
        (
            "optim.adam_kernel=foreach asks for torch's AdamW",
            "te's FusedAdam",
            "use optim.adam_kernel=auto",
        ),
    ),
]


@pytest.mark.parametrize(
    "cuda,keys,fragments", REFUSED, ids=[f"{'cuda' if c else 'cpu'}-{k}" for c, k, _ in REFUSED]
)
def test_what_cannot_run_here_is_refused(cuda, keys, fragments):
    keys = dict(keys)
    library = keys.pop("library", None)
    with pytest.raises(ValueError) as e:
        decide(_cfg(**keys), cuda=cuda, adam_library=library)
    message = str(e.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_a_wrong_cached_launch_setting_is_refused_at_the_start(monkeypatch):
    from _config import typed_default

    from ufp4_megatron.train.validate import ConfigError, check_machine

    cfg = typed_default("model=tiny")  # train.device=auto: cpu is refused where a GPU is
    for ok in ("0", "1"):
        monkeypatch.setenv("UFP4_CACHED_LAUNCH", ok)
        check_machine(cfg)
    monkeypatch.setenv("UFP4_CACHED_LAUNCH", "true")
    with pytest.raises(
        ConfigError,
        match=r"^UFP4_CACHED_LAUNCH='true': give 1 \(cached kernel "
        r"launches, the default\) or 0 .*, or unset it$",
    ):
        check_machine(cfg)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_trainer_refuses_nccl_on_cpu(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        *FAST,
        "logging.wandb.mode=disabled",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "parallel.backend=nccl",
    ]
    r = run(cmd, tmp_path)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: parallel.backend=nccl needs GPU tensors but this run is on CPU; "
        "use parallel.backend=auto or gloo"
    ], r.stderr
    assert not (tmp_path / "run").exists()


def test_resolve_device_names_the_callers_key():
    assert resolve_device("auto", cuda=True, key="--device") == GPU
    assert resolve_device("auto", cuda=False, key="--device") == CPU
    # a launcher may run on CPU beside a GPU: it hides the GPU from its runs (study --gpus none)
    assert resolve_device("cpu", cuda=True, key="--device") == CPU
    with pytest.raises(
        ValueError,
        match=r"^--device=cuda but no CUDA device is visible here "
        r"\(torch.cuda.is_available\(\) is False\); use "
        r"--device=auto or cpu$",
    ):
        resolve_device("cuda", cuda=False, key="--device")


def _cuda_functions() -> dict:
    return {name: getattr(torch.cuda, name) for name in CUDA_NAMES}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the shims act only without CUDA")
def test_cpu_scope_is_cpu_compat():
    from ufp4_megatron.megatron import cpu_compat

    rt = decide(_cfg(), cuda=False)
    before = _cuda_functions()
    with rt.scope() as shimmed:
        assert shimmed is True and cpu_compat.active()
        assert torch.cuda.current_device() == "cpu"
        assert torch.zeros(2, device="cuda").device == CPU
    assert not cpu_compat.active()
    assert _cuda_functions() == before


def test_gpu_scope_changes_nothing():
    from ufp4_megatron.megatron import cpu_compat

    rt = Runtime(
        device=GPU,
        dtype=torch.bfloat16,
        backend="nccl",
        distributed_optimizer=True,
        optim_sharding="dp_reshardable",
        adam="torch_fused",
    )
    before = _cuda_functions()
    with rt.scope():
        assert _cuda_functions() == before
        assert not cpu_compat.active()


def test_init_outside_the_cpu_scope_is_refused():
    from ufp4_megatron.train import distributed

    rt = Runtime(
        device=CPU,
        dtype=torch.float32,
        backend="gloo",
        distributed_optimizer=True,
        optim_sharding="dp_reshardable",
        adam="torch_fused",
    )
    with pytest.raises(RuntimeError, match=r"inside `with runtime.scope\(\):`"):
        distributed.init(ParallelConfig(), rt, 0)
    assert not torch.distributed.is_initialized()


_TRAIN_IN_PROCESS = r"""
import sys
from pathlib import Path
import torch
from ufp4_megatron.train.footprint import load_config
from ufp4_megatron.train.loop import train
names = ("current_device", "Stream", "Event", "current_stream", "stream", "synchronize")
before = {n: getattr(torch.cuda, n) for n in names}
cfg = load_config(sys.argv[2:])
Path(sys.argv[1]).mkdir()  # what Hydra does for the CLI
records = train(cfg, Path(sys.argv[1]))
changed = [n for n in names if getattr(torch.cuda, n) is not before[n]]
modes = torch._C._len_torch_function_stack()
print("RESULT", len(records), changed, modes)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the shims act only without CUDA")
def test_trainer_restores_torch_cuda(tmp_path):
    overrides = [
        *FAST,
        "train.steps=2",
        "logging.wandb.mode=disabled",
        "checkpoint.save_at_end=true",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    r = run([sys.executable, "-c", _TRAIN_IN_PROCESS, str(tmp_path / "run"), *overrides], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESULT 2 [] 0" in r.stdout, r.stdout[-2000:]
