"""Where a training step's GPU time goes: torch.profiler over one steady step.

    python -m ufp4_megatron.bench --suite profile --model moe_7p9b --recipe ufp4

Builds the trainer's own model, optimizer and data (train/build.py) and steps them as the
trainer does (train.schedule.TrainingStep: its train.cuda_graph and train.weight_cache
included), runs `warmup` steps (with graphs, until one has replayed), profiles one step,
and prints GPU time per
kernel family (GEMM, grouped GEMM, e4m3 tensor amax, QDQ, attention, optimizer, other) and
the top kernels. GPU time is kernel time: idle gaps (host-bound stretches) show as the
difference between the step's wall time and the sum. Where each top kernel is launched from:
the CPU operator that launched it and the scopes above it up to the first named one (an
autograd node such as `_GroupedExpertsFnBackward`, a module's function, `AccumulateGrad`):
kernels of one name (every elementwise add, say) are told apart by their callers; kernels
replayed from a CUDA graph have no launching operator.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

# kernel name fragments -> family (first match wins)
FAMILIES = (
    ("grouped GEMM (CUTLASS)", ("cutlass", "grouped")),
    ("GEMM (cuBLAS)", ("gemm", "nvjet", "xmma", "cublas")),
    # NVFP4's e4m3 tensor amax passes (single, pair, 16-tensor), before QDQ: their names
    # carry "_pair16" too
    ("e4m3 tensor amax (Triton)", ("_tensor_amax",)),
    # our Triton kernels: the row/column QDQ, the pair kernel (both operands of a GEMM in one
    # launch) and the segment-aware grouped variants all carry one of these fragments; the
    # SR key table the QDQ launches read counts with them
    ("QDQ (Triton)", ("_row16", "_col16", "_pair16", "_qdq", "segment", "_draw_keys")),
    ("attention", ("flash", "fmha", "sdpa", "attention", "cudnn")),
    ("optimizer", ("multi_tensor", "adam")),
    ("copies and casts", ("copy", "cast", "fill", "memcpy", "memset", "cat", "index")),
)


def _family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other (elementwise, norms, softmax, routing)"


def _device_us(evt) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(evt, attr):
            return float(getattr(evt, attr))
    return 0.0


def _site(op, depth: int = 3) -> str:
    """`op`, the CPU operator a kernel was launched by, and its enclosing scopes up to the
    first that is not an aten operator (at most `depth` names): "aten::mul <- FBackward"."""
    names, parent = [op.name], op.cpu_parent
    while parent is not None and len(names) < depth:
        names.append(parent.name)
        if not parent.name.startswith("aten::"):
            break
        parent = parent.cpu_parent
    return " <- ".join(names)


def kernel_callers(events, names) -> dict[str, list[tuple[str, float, int]]]:
    """For each kernel name in `names`, its launch sites (`_site`) with the GPU time (us) and
    the number of launches of each, most time first. `events` are the profiler's
    FunctionEvents: each CPU operator carries the kernels it launched."""
    sites = {name: defaultdict(lambda: [0.0, 0]) for name in names}
    for op in events:
        if getattr(op, "device_type", None) != torch.autograd.DeviceType.CPU:
            continue
        for kernel in getattr(op, "kernels", ()):
            if kernel.name in sites:
                slot = sites[kernel.name][_site(op)]
                slot[0] += kernel.duration
                slot[1] += 1
    return {
        name: sorted(((s, us, n) for s, (us, n) in found.items()), key=lambda r: -r[1])
        for name, found in sites.items()
    }


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def callers_table(
    callers: dict[str, list[tuple[str, float, int]]], per_kernel: int = 3
) -> list[str]:
    """Kernel #i (the top table's numbering: names cut short look alike) by launch site."""
    lines = ["| # | launched by | calls | ms |", "| ---: | --- | ---: | ---: |"]
    for i, found in enumerate(callers.values(), 1):
        for site, us, count in found[:per_kernel]:
            lines.append(f"| {i} | `{_short(site, 110)}` | {count} | {us / 1e3:.2f} |")
        if not found:
            lines.append(f"| {i} | (no CPU operator recorded) | | |")
    return lines


def families_table(kernels) -> list[str]:
    """The kernel-family table of `kernels`, (name, GPU us, launches) rows: each family's GPU
    time, launches and share of the kernel time, most time first. Launches count graph nodes
    too: under CUDA graphs a family of many small kernels costs a gap per launch."""
    total = sum(us for _, us, _ in kernels)
    families = defaultdict(lambda: [0.0, 0])
    for name, us, count in kernels:
        family = families[_family(name)]
        family[0] += us
        family[1] += count
    lines = ["| kernel family | ms | launches | % of kernel time |", "| --- | ---: | ---: | ---: |"]
    for name, (us, count) in sorted(families.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {name} | {us / 1e3:.2f} | {count} | {100 * us / total:.1f}% |")
    return lines


def config_problem(overrides: list[str]) -> str | None:
    """None, or one line saying why the trainer would refuse the profiled run's config (a
    `--set` that does not compose, a value out of range, a refused combination): checked
    before a GPU is touched, as the trainer checks it."""
    from ..train.graphs import check_cuda_graph, resolve_weight_cache
    from ..train.overrides import composed
    from ..train.validate import check_config, typed_config

    dcfg, problem = composed(overrides)
    if problem is not None:
        return problem
    try:
        cfg = typed_config(dcfg)
        check_config(cfg)
        check_cuda_graph(cfg, on_gpu=True)  # the profile's step runs on the GPU
        resolve_weight_cache(cfg, device_bytes=None)  # only its check: the GPU decides
    except ValueError as e:  # ConfigError and the runtime's checks: one line each
        return str(e)
    return None


def warmup_steps(warmup: int, cuda_graph: str, cuda_graph_warmup: int) -> int:
    """Steps run before the profiled one: `warmup`, and with CUDA graphs at least the eager
    steps before capture, the capturing step and one replay, so the profiled step replays."""
    return warmup if cuda_graph == "none" else max(warmup, cuda_graph_warmup + 2)


def profile_step(overrides: list[str], *, warmup: int = 3, top: int = 20) -> str:
    """The profile of one steady step of the trainer's run for `overrides` (its model, recipe,
    train.cuda_graph and train.weight_cache as the trainer decides them) on the GPU in bf16,
    after `warmup` steps (`warmup_steps`)."""
    from torch.profiler import ProfilerActivity, profile

    from ..train import distributed, schedule
    from ..train.build import build_run
    from ..train.footprint import load_config
    from ..train.runtime import decide

    cfg = load_config(overrides)
    t = cfg.train
    t.device, t.dtype = "cuda", "bf16"  # the profile of record: a GPU step in bf16
    try:
        rt = decide(cfg)
    except ValueError as e:  # the runtime's one-line refusals: graphs, cache, this machine
        raise SystemExit(f"--suite profile: {e}") from None
    warmup = warmup_steps(warmup, rt.cuda_graph, t.cuda_graph_warmup)
    built = build_run(cfg, rt, n_train=(warmup + 1) * t.global_batch, n_valid=1)
    step = schedule.TrainingStep(built, cfg, rt)

    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step(warmup)
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    # GPU-side user annotations (e.g. torch.optim's "Optimizer.step#AdamW.step" range) are
    # CUDA events too: they span the kernels inside them, so counting them counts those twice
    kernels = [
        (e.key, _device_us(e), e.count)
        for e in prof.key_averages()
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and _device_us(e) > 0
    ]
    total_ms = sum(us for _, us, _ in kernels) / 1e3
    lines = [
        f"profile {' '.join(overrides)} (cuda graphs {rt.cuda_graph}, weight cache "
        f"{rt.weight_cache}, {warmup} steps before): step wall {wall_ms:.1f} ms, GPU kernel time "
        f"{total_ms:.1f} ms in {sum(n for _, _, n in kernels)} kernel launches "
        f"({100 * total_ms / wall_ms:.0f}% of wall; the rest the GPU idle, waiting for the "
        "host or between launches), peak memory "
        f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB",
        "",
        *families_table(kernels),
    ]
    lines += [
        "",
        f"| # | top {top} kernels | calls | ms | % |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    top_kernels = sorted(kernels, key=lambda k: -k[1])[:top]
    for i, (name, us, count) in enumerate(top_kernels, 1):
        share = 100 * us / 1e3 / total_ms
        lines.append(f"| {i} | `{_short(name, 90)}` | {count} | {us / 1e3:.2f} | {share:.1f}% |")
    callers = kernel_callers(prof.events(), [name for name, _, _ in top_kernels])
    lines += ["", "Where the top kernels are launched:", ""]
    lines += callers_table(callers)
    distributed.shutdown()
    return "\n".join(lines)
