"""The step benchmark's bookkeeping (ufp4_megatron/bench/step.py), on CPU.

- model FLOPs per token follow PaLM's 6 N + 12 L d s, with N the multiplied parameters (the
  input embedding lookup and norms left out, top-k experts only);
- run_suite end to end on CPU: real trainer subprocesses (tiny, 3 steps, checkpoint at the
  end, 2 passes) come back as rows with their median and spread, checkpoint (size, save
  seconds and filesystem) and ratios; a
  run that fails comes back as a run that says so; repeated runs aggregate;
- out-of-memory output is reported as OOM; rows that did not run still render in the table;
  ratios are taken to the BF16 row of the same shape.
"""

import json
import re
import sys

import pytest
import torch

from ufp4_megatron.bench import step


def test_model_flops_small_by_hand():
    flops, total = step.model_flops(step.SHAPES["small"])
    h, L, f, v, s = 768, 12, 2048, 50304, 2048
    n = L * (h * 3 * h + h * h + 3 * h * f) + v * h  # qkv, proj, SwiGLU MLP, tied LM head
    assert flops == 6 * n + 12 * L * h * s
    assert total == 123_587_328  # describe model=small


def test_study_shape_is_the_prereg_runs_shape():
    """--suite profile --model study11m --micro-batches 2 profiles the study's own step."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    from ufp4_megatron.train.footprint import load_config

    design = files("ufp4_megatron") / "configs" / "study" / "prereg.yaml"
    overrides = list(OmegaConf.load(str(design)).overrides)
    prereg = load_config(overrides)
    bench = load_config(step.shape_overrides(step.SHAPES["study11m"], 2))
    assert bench.model == prereg.model and bench.optim == prereg.optim
    for key in ("seq_len", "micro_batch", "global_batch"):
        assert getattr(bench.train, key) == getattr(prereg.train, key), key


def test_model_flops_moe_counts_only_routed_top_k():
    flops, total = step.model_flops(step.SHAPES["moe_7p9b"])
    h, L, d, v, s = 2048, 4, 128, 128256, 4096
    attn = h * d * (16 + 2 * 4) + 16 * d * h
    moe = 4 * 3 * h * 896 + 3 * h * 1024 + h * 64  # top-4 routed, shared expert, router
    assert flops == 6 * (L * (attn + moe) + v * h) + 12 * L * 16 * d * s
    assert total > 6 * (L * (attn + moe) + v * h) / 6  # all 64 experts are in the total


def test_failed_trainer_run_becomes_a_row(tmp_path):
    """A trainer that fails comes back as a run that says so (the successful path is
    test_suite_runs_real_trainers_in_passes)."""
    failed = step.run_trainer(
        "bad",
        ["model=tiny", "precision=fp3"],
        runs=tmp_path,
        log=tmp_path / "step.log",
        timeout=120,
    )
    assert failed["rc"] != 0 and failed["metrics"] == []
    assert step._status(failed).startswith("failed")
    assert "===== bad" in (tmp_path / "step.log").read_text()


def test_a_run_dir_left_by_an_earlier_invocation_is_not_reported(tmp_path):
    """A second invocation with the same runs dir measures afresh: the old run's checkpoint
    would make the trainer resume and its metrics would come back as this run's."""
    old = tmp_path / "again"
    (old / "checkpoints" / "step_00000010").mkdir(parents=True)
    (old / "metrics.jsonl").write_text('{"step": 10, "loss": 1.0, "step_time": 0.001}\n')
    run = step.run_trainer(
        "again",
        ["model=tiny", "precision=fp3"],
        runs=tmp_path,
        log=tmp_path / "step.log",
        timeout=120,
    )
    assert run["rc"] != 0 and run["metrics"] == []
    assert not (old / "checkpoints").exists()


def test_oom_and_missing_rows_render():
    oom = {
        "rc": 1,
        "tail": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate",
        "metrics": [],
    }
    assert step._status(oom) == "OOM"
    assert step._status({"rc": 124, "tail": "", "metrics": []}) == "timeout"
    done = {"rc": 1, "tail": "CheckpointingException", "metrics": [{}] * 12}
    assert step._status(done, 12) == "steps ok, then failed (rc=1)"
    rows = [
        dict(
            model="small",
            recipe="bf16",
            status="ok",
            steps=12,
            step_ms=100.0,
            tokens_per_s=1.0,
            mfu=0.3,
            peak_mem_gib=10.0,
            checkpoint="end: saved 1.0 GiB",
            final_loss=5.0,
            step_min_ms=97.31,
            step_max_ms=104.0,
        ),
        dict(
            model="small",
            recipe="ufp4",
            status="ok",
            steps=12,
            step_ms=110.0,
            tokens_per_s=1.0,
            mfu=0.27,
            peak_mem_gib=10.5,
            checkpoint="end: saved 1.0 GiB",
            final_loss=5.1,
        ),
        dict(
            model="small",
            recipe="nvfp4",
            status="OOM",
            steps=0,
            step_ms=float("nan"),
            tokens_per_s=float("nan"),
            mfu=float("nan"),
            peak_mem_gib=float("nan"),
            checkpoint="end: not written",
            final_loss=None,
        ),
        dict(model="moe_124b", recipe="bf16", status="not run (time budget)"),
    ]
    step._add_ratios(rows)
    assert abs(rows[1]["x_bf16"] - 1.1) < 1e-12 and abs(rows[1]["mem_x_bf16"] - 1.05) < 1e-12
    text = step.table(rows)
    assert text.count("\n") == len(rows) + 1
    assert "| small | - | ufp4 | ok | 110.0 | - | 1.100 | - |" in text  # no spread, no floor
    assert "| small | - | bf16 | ok | 100.0 | 97.3-104.0 | 1.000 |" in text
    assert "| small | - | nvfp4 | OOM |" in text and "not run (time budget)" in text
    assert all(line.count("|") == text.splitlines()[0].count("|") for line in text.splitlines())


def _run(step_ms, lo, hi, status="ok", mem=10.0, loss=5.0):
    return dict(
        status=status,
        steps=12,
        step_ms=step_ms,
        step_min_ms=lo,
        step_max_ms=hi,
        peak_mem_gib=mem,
        checkpoint="end: saved 1.0 GiB",
        wall_s=60.0,
        final_loss=loss,
    )


def test_repeated_runs_aggregate_and_show_their_spread():
    """Two passes: a row is the median of its runs' medians, each run's shown, the ratio to
    BF16 per pass (run i against BF16's run i), steady-step range over both runs."""
    tokens, flops, peak = 1000, 1e9, 100.0
    bf16 = step._aggregate([_run(80.0, 78.0, 84.0), _run(90.0, 85.0, 95.0)], tokens, flops, peak)
    ufp4 = step._aggregate(
        [_run(120.0, 100.0, 130.0), _run(110.0, 104.0, 126.0, mem=10.5)], tokens, flops, peak
    )
    assert (bf16["step_ms"], bf16["runs_ms"], bf16["runs"]) == (85.0, [80.0, 90.0], 2)
    assert (ufp4["step_min_ms"], ufp4["step_max_ms"], ufp4["peak_mem_gib"]) == (100.0, 130.0, 10.5)
    assert abs(ufp4["tokens_per_s"] - tokens / 0.115) < 1e-6
    rows = [dict(model="small", recipe="bf16") | bf16, dict(model="small", recipe="ufp4") | ufp4]
    step._add_ratios(rows)
    assert abs(rows[1]["x_bf16"] - 115 / 85) < 1e-12
    assert rows[1]["x_bf16_runs"] == [120 / 80, 110 / 90]
    text = step.table(rows)
    cells = "| small | - | ufp4 | ok | 115.0 (120.0, 110.0) | 100.0-130.0 | 1.353 (1.500, 1.222) |"
    assert cells in text
    # a failed run is said, the others still count; no runs: not run
    mixed = step._aggregate(
        [
            _run(80.0, 78.0, 84.0),
            _run(float("nan"), float("nan"), float("nan"), status="OOM", mem=float("nan")),
        ],
        tokens,
        flops,
        peak,
    )
    assert mixed["status"] == "1 of 2 ok; OOM" and mixed["step_ms"] == 80.0
    assert mixed["peak_mem_gib"] == 10.0  # the OOM run's NaN memory does not hide the other
    assert step._aggregate([], tokens, flops, peak) == {"status": "not run (time budget)"}
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="whole number of runs per row"):
            step.run_suite(None, repeats=bad)
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="whole number of micro-batches per step"):
            step.run_suite(None, micro_batches=bad)


def test_ratios_and_floors_are_to_bf16_of_the_same_variant():
    """Each variant (e.g. CUDA graphs) is its own comparison: a 4-bit row's ratio and floor
    are against the BF16 row of its shape and variant, never another variant's."""
    rows = [
        dict(model="small", variant="eager", recipe="bf16", steps=12, step_ms=100.0),
        dict(model="small", variant="eager", recipe="ufp4", steps=12, step_ms=130.0),
        dict(model="small", variant="graphs", recipe="bf16", steps=12, step_ms=80.0),
        dict(model="small", variant="graphs", recipe="ufp4", steps=12, step_ms=88.0),
    ]
    for r in rows:
        r.update(peak_mem_gib=10.0, status="ok", qdq_floor_ms=4.0)
    step._add_ratios(rows)
    assert [r["x_bf16"] for r in rows] == [1.0, 1.3, 1.0, 1.1]
    assert rows[1]["floor_x_bf16"] == 104 / 100 and rows[3]["floor_x_bf16"] == 84 / 80
    assert "floor_x_bf16" not in rows[0]  # BF16 has no QDQ passes
    text = step.table(rows)
    assert "| small | graphs | ufp4 | ok | 88.0 | - | 1.100 | 1.050 |" in text


def test_qdq_floor_counts_each_operand_layout_by_hand():
    """floor.py: per linear (K, N) and micro-batch of T tokens, 2 T (K + N) activation and
    2 N K weight elements, 4 bytes each; kept weights once per step; routed experts see
    top-k / E of the tokens (times the capacity factor when padded); e4m3 tensor scales add
    one 2-byte read of each operand."""
    from ufp4_megatron.bench.floor import qdq_bytes_per_step
    from ufp4_megatron.train.footprint import load_config, quantized_linears

    dense = load_config(["model=small", "train.seq_len=2048", "train.micro_batch=8"])
    h, f, L, T = 768, 2048, 12, 2048 * 8
    layer = [(h, 3 * h), (h, h), (h, 2 * f), (f, h)]  # qkv (12 heads, no GQA), proj, fc1, fc2
    assert [(k, n) for k, n, _, _ in quantized_linears(dense)] == layer * L
    act = sum(2 * T * (k + n) for k, n in layer) * L
    w = sum(2 * n * k for k, n in layer) * L
    assert qdq_bytes_per_step(dense, 4, "none") == 4 * (4 * act + 4 * w)
    assert qdq_bytes_per_step(dense, 4, "all") == 4 * (4 * act + w)
    # NVFP4's e4m3 tensor scales: one more bf16 read of x, dY and w (T (K + N) and N K
    # elements, 2 bytes: act and w over again), per micro-batch, w's once when kept
    nv = load_config(
        ["model=small", "train.seq_len=2048", "train.micro_batch=8", "precision=nvfp4"]
    )
    assert qdq_bytes_per_step(nv, 4, "none") == 4 * (4 * act + 4 * w) + 4 * act + 4 * w
    assert qdq_bytes_per_step(nv, 4, "all") == 4 * (4 * act + w) + 4 * act + w
    for name in ("mxfp4", "e2m1", "ufp4_int4"):  # fp32 or e8m0 block scales: no amax pass
        other = load_config(
            ["model=small", "train.seq_len=2048", "train.micro_batch=8", f"precision={name}"]
        )
        assert qdq_bytes_per_step(other, 4, "none") == 4 * (4 * act + 4 * w), name
    bf16 = load_config(["model=small", "precision=bf16"])
    assert quantized_linears(bf16) == [] and qdq_bytes_per_step(bf16, 4, "all") == 0

    moe = load_config(["model=moe_small", "model.moe_capacity_factor=1.5"])
    experts = [s for s in quantized_linears(moe) if s[3]]
    assert len(experts) == 2 * 8 * 5  # fc1, fc2 of 8 experts in the 5 MoE layers
    assert {s[2] for s in experts} == {2 / 8 * 1.5}
    kept_experts = qdq_bytes_per_step(moe, 2, "experts")
    assert kept_experts < qdq_bytes_per_step(moe, 2, "none")
    assert qdq_bytes_per_step(moe, 2, "all") < kept_experts


def test_variant_names_and_overrides_are_checked():
    from ufp4_megatron.bench.__main__ import parse_variant

    assert parse_variant("eager") == ("eager", ())
    assert parse_variant("graphs:train.cuda_graph=local  model.x=1") == (
        "graphs",
        ("train.cuda_graph=local", "model.x=1"),
    )
    for bad in ("", ":train.cuda_graph=local", "../up:a=1", "a b:x=1", "g:train.cuda_graph"):
        with pytest.raises(ValueError, match="--variant"):
            parse_variant(bad)


# slow (make test's 20-minute budget): 8 trainer runs; the benchmark runs on GPUs (make bench),
# its bookkeeping is the tests above, a trainer run of it test_failed_trainer_run_becomes_a_row
@pytest.mark.slow
def test_suite_runs_real_trainers_in_passes(tmp_path, monkeypatch):
    """run_suite end to end on CPU with real trainer subprocesses: a tiny shape, bf16 and
    ufp4, 2 passes, 2 micro-batches per step, checkpoint at the end; only the GEMM-rate probe
    (CUDA) is replaced."""
    monkeypatch.setitem(step.SHAPES, "tiny", step.Shape(("model=tiny",), 64, 2))
    monkeypatch.setattr(step, "gemm_tflops", lambda: 1.0)
    monkeypatch.setattr(step, "copy_bandwidth", lambda: 1e12)
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    logged = []
    rows = step.run_suite(
        tmp_path,
        models=("tiny",),
        recipes=("bf16", "ufp4"),
        steps=3,
        skip=1,
        extra=("train.device=cpu",),
        repeats=2,
        micro_batches=2,
        log=logged.append,
    )
    assert [(r["model"], r["recipe"], r["status"], r["runs"], r["steps"]) for r in rows] == [
        ("tiny", "bf16", "ok", 2, 3),
        ("tiny", "ufp4", "ok", 2, 3),
    ]
    ufp4 = rows[1]
    assert len(ufp4["runs_ms"]) == 2 and len(ufp4["x_bf16_runs"]) == 2
    assert ufp4["step_min_ms"] <= ufp4["step_ms"] <= ufp4["step_max_ms"]
    # its size on disk, the save's seconds from the trainer's own line, where it went
    fs = step.filesystem(tmp_path)
    assert fs and re.fullmatch(rf"end: saved [0-9.]+ GiB in [0-9.]+ s to {fs}", ufp4["checkpoint"])
    # the trainer accumulated 2 micro-batches of 2 x 64 tokens per step, and the row's
    # throughput and MFU count all of them
    assert [(r["global_batch"], r["tokens_per_step"]) for r in rows] == [(4, 256), (4, 256)]
    assert abs(ufp4["tokens_per_s"] - 256 / (ufp4["step_ms"] / 1e3)) < 1e-6
    passes = [json.loads(m)["repeat"] for m in logged if m.startswith("{")]
    assert passes == [1, 1, 2, 2]  # one pass over all rows, then the next
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["data"]  # run dirs removed


def test_filesystem_is_the_deepest_mount_above_the_path(monkeypatch):
    """The checkpoint cell's filesystem: the last-mounted of the deepest mount points that
    hold the path (a made-up mount table); nothing where the table cannot be read."""
    from types import SimpleNamespace

    import psutil

    table = [
        ("/", "overlay"),
        ("/dev/shm", "tmpfs"),
        ("/data", "ext4"),
        ("/data/my runs", "xfs"),
        ("/data", "tmpfs"),  # mounted over /data: it is what /data/x holds
    ]
    mounts = [SimpleNamespace(mountpoint=point, fstype=fs) for point, fs in table]
    monkeypatch.setattr(psutil, "disk_partitions", lambda all=False: mounts if all else [])
    got = {p: step.filesystem(p) for p in ("/dev/shm/r", "/dev/shmem", "/data/x")}
    assert got == {"/dev/shm/r": "tmpfs", "/dev/shmem": "overlay", "/data/x": "tmpfs"}
    assert step.filesystem("/data/my runs/ckpt") == "xfs"
    assert step.filesystem("/") == "overlay"

    def unreadable(all=False):
        raise PermissionError("/proc/self/mounts")

    monkeypatch.setattr(psutil, "disk_partitions", unreadable)
    assert step.filesystem("/x") == ""


def test_bench_cli_names_what_is_wrong():
    import subprocess

    import torch

    def run(*args):
        res = subprocess.run(
            [sys.executable, "-m", "ufp4_megatron.bench", *args], capture_output=True, text=True
        )
        assert res.returncode != 0
        return res.stderr.strip().splitlines()[-1]

    assert run("--suite", "steps").startswith("unknown suite(s) ['steps']; valid:")
    assert "unknown model(s) ['moe_1t']; valid: small, dense_1p5b" in run("--models", "moe_1t")
    assert "unknown recipe(s) ['fp3']" in run("--suite", "step", "--recipes", "bf16,fp3")
    assert run("--suite", "step", "--repeats", "0") == "--repeats 0: give 1 or more runs per row"
    assert (
        run("--suite", "step", "--micro-batches", "0")
        == "--micro-batches 0: give 1 or more micro-batches per step"
    )
    # the profiled run's config, refused as the trainer refuses it, before a GPU is needed
    profile = ("--suite", "profile", "--model", "dense_1p5b", "--set")
    assert run(*profile, "train.cuda_graph=locl") == (
        "--suite profile: train.cuda_graph='locl'; valid: none, local, full_iteration"
    )
    assert run(*profile, "model=nope").startswith(
        "--suite profile: In 'config': Could not find 'model/nope'"
    )
    if not torch.cuda.is_available():
        assert run("--suite", "step") == "the benchmarks need a CUDA device"
        assert run("--suite", "amax") == "the benchmarks need a CUDA device"
        assert run("--suite", "formats") == "the benchmarks need a CUDA device"
        assert run(*profile, "train.cuda_graph=local") == "the benchmarks need a CUDA device"


@pytest.mark.parametrize(
    "override, says",
    [
        ("train.weight_cache=sometimes", "train.weight_cache='sometimes'; valid: auto"),
        ("train.cuda_graph_warmup=0", "train.cuda_graph_warmup=0 must be >= 1"),
        ("train.seq_len=abc", "Error merging override train.seq_len=abc"),
        ("train.lr=-1", "Could not override 'train.lr'"),
        ("train.cuda_graph=local", "with MoE needs static expert shapes"),  # moe, dropless
    ],
)
def test_profile_refuses_a_config_the_trainer_refuses(override, says):
    """--suite profile's --set: one line from the trainer's own checks, on any machine."""
    from ufp4_megatron.bench.profile import config_problem

    problem = config_problem(["model=moe_small", override])
    assert problem is not None and says in problem and "\n" not in problem
    assert config_problem(["model=moe_small"]) is None


def test_amax_table_reads_each_pass_against_the_copy():
    from ufp4_megatron.bench.amax import amax_table

    rows = [
        dict(
            shape=(4096, 2048), what="both, one pair pass", ms=0.01, tbs=1.68, pct=45.2, vs_two=0.55
        )
    ]
    assert amax_table(rows).splitlines()[-1] == (
        "| 4096x2048 | both, one pair pass | 0.0100 | 1.68 | 45% | 0.55 |"
    )


def test_profile_families_name_the_kernels_of_record():
    """Kernel names from H200 profiles (docs/performance.md): the pair kernel counts as QDQ,
    not as "other", or the QDQ share of a dense step would read as zero; NVFP4's amax
    kernels (one of them named *_pair16*) as their own family, not as QDQ."""
    from ufp4_megatron.bench.profile import _family

    assert _family("_pair16_kernel") == "QDQ (Triton)"
    assert _family("_row16_kernel") == "QDQ (Triton)"
    assert _family("_col16_kernel") == "QDQ (Triton)"
    assert _family("_qdq_kernel") == "QDQ (Triton)"
    assert _family("_draw_keys_kernel") == "QDQ (Triton)"
    for amax in ("_tensor_amax_kernel", "_tensor_amax16_kernel", "_tensor_amax_pair16_kernel"):
        assert _family(amax) == "e4m3 tensor amax (Triton)", amax  # NVFP4's own passes
    assert _family("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "GEMM (cuBLAS)"
    assert _family("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16") == "attention"
    assert (
        _family("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>")
        == "optimizer"
    )
    assert _family("Memcpy DtoD (Device -> Device)") == "copies and casts"
    assert _family("void at::native::vectorized_elementwise_kernel<4, AUnaryFunctor>").startswith(
        "other"
    )


def test_profile_families_count_time_and_launches():
    """Each family's GPU time and launches summed over its kernels, most time first: the
    launches say how many graph nodes a family costs (NVFP4's small amax and scale kernels)."""
    from ufp4_megatron.bench.profile import families_table

    kernels = [
        ("_row16_kernel", 3000.0, 64),
        ("_tensor_amax_pair16_kernel", 500.0, 128),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 6000.0, 8),
        ("_col16_kernel", 1000.0, 64),
        ("_tensor_amax_kernel", 500.0, 64),
    ]
    assert families_table(kernels) == [
        "| kernel family | ms | launches | % of kernel time |",
        "| --- | ---: | ---: | ---: |",
        "| GEMM (cuBLAS) | 6.00 | 8 | 54.5% |",
        "| QDQ (Triton) | 4.00 | 128 | 36.4% |",
        "| e4m3 tensor amax (Triton) | 1.00 | 192 | 9.1% |",
    ]


def test_profile_callers_name_the_op_and_its_scope():
    """The callers table names, for a kernel, the operator that launched it and the scopes
    above it up to the first that is not an aten operator (at most three names), summed
    over launches; kernels outside the list and the kernels' own events are not counted."""
    from types import SimpleNamespace as Event

    from ufp4_megatron.bench.profile import callers_table, kernel_callers

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def op(name, parent=None, kernels=(), device=cpu):
        kernels = [Event(name=k, duration=us) for k, us in kernels]
        return Event(name=name, cpu_parent=parent, kernels=kernels, device_type=device)

    backward = op("FBackward", op("autograd::engine::evaluate_function: FBackward"))
    linear = op("aten::linear", op("_GroupedExpertsFn"))
    deep = op("aten::b", op("aten::c", op("aten::d", op("Outer"))))
    events = [
        op("aten::mul", backward, [("elementwise", 5.0)]),
        op("aten::mul", backward, [("elementwise", 7.0), ("other", 99.0)]),
        op("aten::addmm", linear, [("elementwise", 2.0)]),
        op("aten::a", deep, [("elementwise", 1.5)]),
        op("aten::add_", None, [("elementwise", 1.0)]),
        op("elementwise", None, [("elementwise", 50.0)], device=cuda),  # the kernel itself
    ]
    callers = kernel_callers(events, ["elementwise", "never_launched"])
    assert callers["elementwise"] == [
        ("aten::mul <- FBackward", 12.0, 2),
        ("aten::addmm <- aten::linear <- _GroupedExpertsFn", 2.0, 1),
        ("aten::a <- aten::b <- aten::c", 1.5, 1),
        ("aten::add_", 1.0, 1),
    ]
    assert callers["never_launched"] == []
    table = callers_table(callers, per_kernel=2)
    assert table[2:] == [
        "| 1 | `aten::mul <- FBackward` | 2 | 0.01 |",
        "| 1 | `aten::addmm <- aten::linear <- _GroupedExpertsFn` | 1 | 0.00 |",
        "| 2 | (no CPU operator recorded) | | |",
    ]


def test_profile_sites_read_torch_profiler_scopes():
    """The scope names `_site` reads are torch.profiler's own: an autograd Function's forward
    and backward nodes, and the aten operators around a GEMM."""
    from torch.profiler import ProfilerActivity, profile

    from ufp4_megatron.bench.profile import _site

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = torch.randn(8, 8, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        Double.apply(torch.nn.functional.linear(x, x)).sum().backward()
    sites = {_site(e) for e in prof.events() if e.name in ("aten::mul", "aten::mm")}
    assert {"aten::mul <- Double", "aten::mul <- DoubleBackward"} <= sites, sites
    assert any(s.startswith("aten::mm <- aten::matmul <- aten::linear") for s in sites), sites


def test_shape_overrides_are_the_step_rows_and_the_profiles():
    # one list for both (bench --suite step's runs and --suite profile), with the
    # accumulated global batch
    assert step.shape_overrides(step.SHAPES["moe_7p9b"], 8) == [
        "model=moe_7p9b",
        "model.num_layers=4",
        "train.seq_len=4096",
        "train.micro_batch=1",
        "train.global_batch=8",
    ]
    assert step.shape_overrides(step.SHAPES["small"])[-1] == "train.global_batch=8"
