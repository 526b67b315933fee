"""Host vs GPU time of the quantization path on one GPU.

Run on one CUDA GPU (< 90 s on an H200):   python3 gpu/host_overhead.py
Writes $OUT/host_overhead.json (OUT defaults to runs/gpu/host_overhead) and prints the tables
last.
Without a GPU, `--cpu` times the host glue of the kernel path on CPU tensors with Triton's
launcher replaced by a no-op (TRITON_INTERPRET=1 so the kernels import), and the torch
reference path. (Static SASS counts of the kernels, on any machine:
`python tests/kernels/sm90_compile.py --sass`.)

Columns, per call (us):
  host    wall time of 50 back-to-back calls / 50, no synchronisation inside the loop: the
          Python + launch cost the CPU pays (the GPU runs behind, the launch queue never fills)
  loop    CUDA events around 50 back-to-back calls / 50: what a caller waiting on the result
          sees, max(host, device) in steady state
  device  the same calls captured in one CUDA graph over rotating inputs (>= 4x L2), replayed:
          GPU time alone
Rows for an 8192x8192 bf16 tensor (e1m2, 1x16 fp32 scales): the bare Triton launch (all
arguments precomputed: the launcher's own cost), kernels.quantize_view, public quantize();
then ops.fprop/dgrad/wgrad (ufp4) at the dense_1p5b layer shapes with 8192 tokens and the
bf16 GEMM alone; the pair kernel (both operands of a GEMM in one launch) against two
launches; kernels/launch.py's cached launch against Triton's (host time, identical
outputs; `--only cached`); and the SR kernels against the copy roofline. The target:
public quantize() loop within 1.2x of the bare kernel's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

N_CALLS = 50
BUDGET_S = 80  # sections stop starting new shapes past this (the run must end < 90 s)
T0 = time.time()


def host_us(fn, args, n=N_CALLS) -> float:
    sync()
    t = time.perf_counter()
    for i in range(n):
        fn(args[i % len(args)])
    dt = time.perf_counter() - t
    sync()
    return dt / n * 1e6


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def loop_us(fn, args, n=N_CALLS) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sync()
    start.record()
    for i in range(n):
        fn(args[i % len(args)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n * 1e3


def device_us(fn, args, replays=5) -> float:
    """Per-call GPU time: one call per input captured in a CUDA graph, replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for a in args:
            fn(a)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for a in args:
            fn(a)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sync()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    del graph
    return start.elapsed_time(end) / (replays * len(args)) * 1e3


def measure(name, fn, args, rows, log, device=True, **extra):
    for a in args[:2]:
        fn(a)  # compile, warm the caches
    row = dict(what=name, host_us=host_us(fn, args), loop_us=loop_us(fn, args), **extra)
    row["device_us"] = device_us(fn, args) if device else float("nan")
    rows.append(row)
    log(row)
    return row


def rotating(make, nbytes, l2=60 * 2**20):
    return [make() for _ in range(max(2, min(8, -(-4 * l2 // max(nbytes, 1)))))]


def bare_launch(view, **kw):
    """The 16-tensor kernel launch of kernels.quantize_view(view, ...), every argument
    precomputed: (a function of the input view that only calls kernel[grid](...), the output
    view it writes)."""
    from ufp4_megatron.kernels import dispatch as launch

    t, along_rows = launch._orient(view)
    lay = launch._layout(view, **kw)
    _, out_view, n, warps, args, (t0, t1) = launch._job16(t, lay, along_rows, None)
    kernel = launch.k16._col16_kernel if along_rows else launch.k16._row16_kernel
    tiles = dict(BG=t0, BB=t1) if along_rows else dict(BR=t0, BG=t1)
    consts = dict(**lay.plan.consts16, **tiles, INTERP=launch.INTERPRETED, num_warps=warps)
    rest = args[1:]
    return (lambda x: kernel[n](x.t() if along_rows else x, *rest, **consts)), out_view


def kernel_section(rows, log):
    from ufp4_megatron import quantize
    from ufp4_megatron.kernels import quantize_view
    from ufp4_megatron.numerics.hadamard import get_rht

    shape = (8192, 8192)
    n = shape[0] * shape[1]
    xs = rotating(lambda: torch.randn(shape, device="cuda", dtype=torch.bfloat16), 4 * n)
    out = torch.empty_like(xs[0])
    measure("copy (roofline)", lambda x: out.copy_(x), xs, rows, log, shape="8192x8192")  # noqa: F821 - called before the del below
    rht = get_rht(16, 0)
    for layout, rounding, r in (
        ("col", "rtne", rht),
        ("row", "rtne", rht),
        ("row", "rtne", None),
        ("col", "sr", rht),
        ("row", "sr", rht),
    ):
        spec = dict(grid="e1m2", rounding=rounding, rht=r, seed=1234)
        tag = f"{layout} {rounding}{'+rht16' if r else ''}"
        view = (lambda x: x.t()) if layout == "col" else (lambda x: x)
        bare, bare_out = bare_launch(view(xs[0]), **spec)
        bare(view(xs[0]))
        same = bool(torch.equal(bare_out, quantize_view(view(xs[0]), **spec)))
        base = measure(
            f"bare launch, {tag}",
            lambda x: bare(view(x)),
            xs,
            rows,
            log,
            shape="8192x8192",
            bare_equals_quantize_view=same,
        )
        measure(
            f"kernels.quantize_view, {tag}",
            lambda x: quantize_view(view(x), **spec),
            xs,
            rows,
            log,
            shape="8192x8192",
        )
        q = measure(
            f"quantize(), {tag}",
            lambda x: quantize(
                x,
                "e1m2",
                rounding=rounding,
                rht=16 if r else None,
                seed=1234,
                dim=0 if layout == "col" else -1,
            ),
            xs,
            rows,
            log,
            shape="8192x8192",
        )
        q["x_bare_loop"] = q["loop_us"] / base["loop_us"]
        q["x_bare_device"] = q["loop_us"] / base["device_us"]
    del xs, out
    torch.cuda.empty_cache()


def layer_section(rows, log):
    from ufp4_megatron import get_recipe
    from ufp4_megatron.bench.layer import TOKENS, dense_1p5b_shapes
    from ufp4_megatron.kernels import quantize_pair, quantize_view
    from ufp4_megatron.numerics.hadamard import get_rht
    from ufp4_megatron.quant import ops

    recipe = get_recipe("ufp4")
    rht = get_rht(16, 0)
    kw = dict(grid="e1m2", rht=rht, keep_padding=True)
    for name, (k, nn) in dense_1p5b_shapes().items():
        if time.time() - T0 > BUDGET_S:
            log(dict(what=f"skipped layer {name}: past the {BUDGET_S} s budget"))
            continue

        def make():
            return (
                torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16),
                torch.randn(nn, k, device="cuda", dtype=torch.bfloat16) * k**-0.5,
                torch.randn(TOKENS, nn, device="cuda", dtype=torch.bfloat16),
            )

        ins = rotating(make, 2 * (TOKENS * k + nn * k + TOKENS * nn))
        shape = f"{name} {k}x{nn}"
        measure("bf16 GEMM x @ w.t()", lambda a: a[0] @ a[1].t(), ins, rows, log, shape=shape)
        for gemm, fn in (
            ("fprop", lambda a: ops.fprop(a[0], a[1], recipe, seed=7)),
            ("dgrad", lambda a: ops.dgrad(a[2], a[1], recipe, seed=7)),
            ("wgrad", lambda a: ops.wgrad(a[2], a[0], recipe, seed=7)),
        ):
            measure(f"ops.{gemm} ufp4", fn, ins, rows, log, shape=shape)
        # ops.fprop's host time is more than its pair launch's plus the GEMM's: these two rows
        # bisect it (ops' operand glue with the launch, and the product alone on the quantized
        # operands)
        measure(
            "fprop operands: ops._gemm_operands",
            lambda a: ops._gemm_operands(
                "fprop", recipe, (a[0], a[1]), ((0, 0), (0, 0)), seed=7, backend="auto"
            ),
            ins,
            rows,
            log,
            shape=shape,
        )
        q = ops._gemm_operands(
            "fprop", recipe, (ins[0][0], ins[0][1]), ((0, 0), (0, 0)), seed=7, backend="auto"
        )
        measure(
            "fprop product on quantized operands",
            lambda a: (q[0] @ q[1].t()).to(a[0].dtype),
            ins,
            rows,
            log,
            shape=shape,
        )
        measure(
            "fprop operands: pair (1 launch)",
            lambda a: quantize_pair(a[0], kw, a[1], kw),
            ins,
            rows,
            log,
            shape=shape,
        )
        measure(
            "fprop operands: 2 launches",
            lambda a: (quantize_view(a[0], **kw), quantize_view(a[1], **kw)),
            ins,
            rows,
            log,
            shape=shape,
        )
        sr = dict(kw, rounding="sr", seed=3)
        measure(
            "wgrad operands: pair (1 launch)",
            lambda a: quantize_pair(a[2].t(), sr, a[0].t(), kw),
            ins,
            rows,
            log,
            shape=shape,
        )
        measure(
            "wgrad operands: 2 launches",
            lambda a: (quantize_view(a[2].t(), **sr), quantize_view(a[0].t(), **kw)),
            ins,
            rows,
            log,
            shape=shape,
        )
        del ins
        torch.cuda.empty_cache()


def direct_launch_probe(rows, log):
    """What bypassing Triton's JIT dispatch would buy: the compiled kernel's own launcher
    called with precomputed arguments (an experiment here, not used by the library)."""
    from ufp4_megatron.kernels import dispatch as launch
    from ufp4_megatron.numerics.hadamard import get_rht

    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    lay = launch._layout(x, "e1m2", rht=get_rht(16, 0))
    _, _, n, warps, args, (t0, t1) = launch._job16(x, lay, False, None)
    consts = dict(**lay.plan.consts16, BR=t0, BG=t1, INTERP=False)
    kernel = launch.k16._row16_kernel
    compiled = kernel[n](*args, **consts, num_warps=warps)
    try:
        dev = torch.cuda.current_device()
        binder = kernel.device_caches[dev][4]
        bound, _, _ = binder(*args, **consts, num_warps=warps)
        values = tuple(bound.values())
        stream = torch.cuda.current_stream().cuda_stream
        run, fn, meta = compiled.run, compiled.function, compiled.packed_metadata

        def direct(_):
            run(n[0], n[1], 1, stream, fn, meta, None, None, None, *values)

        direct(None)
        sync()
    except Exception as e:  # internal API of triton 3.6: report and go on
        log(dict(what="direct launch probe failed", error=repr(e)[:300]))
        return
    measure(
        "256x256 row rtne+rht16: kernel[grid](...)",
        lambda _: kernel[n](*args, **consts, num_warps=warps),
        [None],
        rows,
        log,
        device=False,
        shape="256x256",
    )
    measure(
        "256x256 row rtne+rht16: CompiledKernel.run (direct)",
        direct,
        [None],
        rows,
        log,
        device=False,
        shape="256x256",
    )


def cached_launch_section(rows, log):
    """kernels/launch.py's cached launch against Triton's own, the same calls in one process
    (launch.ENABLED toggled): host time per call, and whether the outputs are identical."""
    from ufp4_megatron import get_recipe, quantize
    from ufp4_megatron.kernels import launch, quantize_pair
    from ufp4_megatron.numerics.hadamard import get_rht
    from ufp4_megatron.quant import ops

    recipe = get_recipe("ufp4")
    kw = dict(grid="e1m2", rht=get_rht(16, 0), keep_padding=True)
    sr = dict(kw, rounding="sr", seed=3)
    tokens, k, n = 8192, 2048, 3072  # dense_1p5b's qkv at 8192 tokens

    def make():
        return (
            torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16),
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5,
            torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16),
        )

    ins = rotating(make, 2 * (tokens * k + n * k + tokens * n))
    cases = {
        "quantize() col rtne+rht16 8192x2048": lambda a: (quantize(a[0], "e1m2", rht=16, dim=0),),
        "fprop operands: pair (1 launch)": lambda a: quantize_pair(a[0], kw, a[1], kw),
        "wgrad operands: pair, SR dY": lambda a: quantize_pair(a[2].t(), sr, a[0].t(), kw),
        "ops.fprop ufp4": lambda a: (ops.fprop(a[0], a[1], recipe, seed=7),),
        "ops.wgrad ufp4": lambda a: (ops.wgrad(a[2], a[0], recipe, seed=7),),
    }
    before = launch.ENABLED
    try:
        for name, fn in cases.items():
            outs = {}
            for on in (False, True):
                launch.ENABLED = on
                outs[on] = [t.clone() for t in fn(ins[0])]
                measure(
                    f"{name}, {'cached' if on else 'Triton'} launch",
                    fn,
                    ins,
                    rows,
                    log,
                    shape=f"qkv {k}x{n}",
                )
            rows[-1]["same_as_triton_launch"] = all(
                torch.equal(a, b) for a, b in zip(outs[False], outs[True])
            )
            log(dict(what=name, same_as_triton_launch=rows[-1]["same_as_triton_launch"]))
    finally:
        launch.ENABLED = before
    del ins
    torch.cuda.empty_cache()


def table(rows) -> str:
    out = [
        "| shape | what | host us | loop us | device us | loop / bare |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "host_us" not in r:
            continue
        ratio = f"{r['x_bare_loop']:.2f}" if "x_bare_loop" in r else ""
        out.append(
            f"| {r.get('shape', '')} | {r['what']} | {r['host_us']:.1f} | "
            f"{r['loop_us']:.1f} | {r['device_us']:.1f} | {ratio} |"
        )
    return "\n".join(out)


def launch_key_cost(log, pair_kernel):
    """Per call, Python only: Triton 3.6's binding of the pair kernel (its generated binder,
    cache key and knob reads: what JITFunction.run does before it launches) against
    kernels/launch.py's key, on the arguments of a dense_1p5b qkv fprop pair call (captured
    with the launch stubbed)."""
    import timeit

    from triton import knobs
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from ufp4_megatron.kernels import dispatch
    from ufp4_megatron.kernels import launch as cached
    from ufp4_megatron.numerics.hadamard import get_rht

    jit = JITFunction(pair_kernel.fn)  # the interpreter's wrapper holds the Python function
    binder = create_function_from_signature(jit.signature, jit.params, BaseBackend)
    seen = {}
    real, real_check = dispatch.launch, dispatch.check_device
    dispatch.launch = lambda kernel, grid, *a, **k: seen.update(args=a, kwargs=k)
    dispatch.check_device = lambda x: None
    try:
        kw = dict(grid="e1m2", rht=get_rht(16, 0), keep_padding=True)
        dispatch.quantize_pair(
            torch.randn(8192, 2048, dtype=torch.bfloat16),
            kw,
            torch.randn(3072, 2048, dtype=torch.bfloat16),
            kw,
        )
    finally:
        dispatch.launch, dispatch.check_device = real, real_check
    args, kwargs = seen["args"], seen["kwargs"]
    options = dict(kwargs, debug=False, instrumentation_mode="")
    lookup: dict = {}

    def tritons():
        bound, spec, opts = binder(*args, **options)
        lookup.get((tuple(spec), str(opts)))
        knobs.runtime.debug, knobs.compilation.instrumentation_mode  # noqa: B018 - read for the cost of the read
        knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook  # noqa: B018 - read for the cost of the read
        return tuple(bound.values())

    def ours():
        lookup.get(cached._key(jit, 0, args, kwargs))
        return args

    rows = []
    for name, fn in (
        (f"Triton bind + key, pair kernel ({len(jit.params)} parameters)", tritons),
        ("kernels/launch.py key, pair kernel", ours),
    ):
        best = min(timeit.repeat(fn, number=2000, repeat=5)) / 2000 * 1e6
        rows.append(dict(what=name, host_us=best))
        log(rows[-1])
    return rows


def cpu_glue(log):
    """Host glue of the kernel path on CPU tensors, Triton's launcher stubbed out."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.set_num_threads(1)
    import importlib
    import pkgutil

    import ufp4_megatron.kernels as kernels_pkg
    from ufp4_megatron import get_recipe, quantize
    from ufp4_megatron.kernels import quantize16_triton
    from ufp4_megatron.quant import ops

    rows = launch_key_cost(log, quantize16_triton._pair16_kernel)

    class NoLaunch:  # kernel[grid](...) does nothing: what remains is our host code
        def __getitem__(self, grid):
            return lambda *a, **k: None

    # every module's *_kernel name (also in older layouts of the package, for before/after)
    for info in pkgutil.iter_modules(kernels_pkg.__path__):
        mod = importlib.import_module(f"{kernels_pkg.__name__}.{info.name}")
        for name in dir(mod):
            if name.endswith("_kernel"):
                setattr(mod, name, NoLaunch())
    x = torch.randn(1024, 1024, dtype=torch.bfloat16)
    w = torch.randn(512, 1024, dtype=torch.bfloat16)
    dy = torch.randn(1024, 512, dtype=torch.bfloat16)
    r = get_recipe("ufp4")
    t = "triton"
    cases = {  # ops with backend="triton" minus the GEMM itself: the operand preparation
        "glue: quantize() col rtne+rht16": lambda: quantize(x, "e1m2", rht=16, dim=0, backend=t),
        "glue: quantize() row rtne+rht16": lambda: quantize(x, "e1m2", rht=16, backend=t),
        "glue: quantize() row sr": lambda: quantize(x, "e1m2", rounding="sr", seed=3, backend=t),
        "glue: fprop operands (ufp4)": lambda: ops._gemm_operands(
            "fprop", r, (x, w), ((0, 0), (0, 0)), seed=1, backend=t
        ),
        "glue: dgrad operands (ufp4)": lambda: ops._gemm_operands(
            "dgrad", r, (dy, w), ((0, 0), (0, 0)), seed=1, backend=t
        ),
        "glue: wgrad operands (ufp4)": lambda: ops._gemm_operands(
            "wgrad", r, (dy, x), ((0, 0), (0, 0)), seed=1, backend=t
        ),
    }
    xs, ws, dys = torch.randn(64, 64), torch.randn(32, 64), torch.randn(64, 32)
    cases |= {  # the torch reference path (CPU training, backend="torch")
        "reference: quantize() col rtne+rht16 64x64": lambda: quantize(xs, "e1m2", rht=16, dim=0),
        "reference: ops.fprop ufp4 64x64": lambda: ops.fprop(xs, ws, r, seed=1),
        "reference: ops.wgrad ufp4 64x64": lambda: ops.wgrad(dys, xs, r, seed=1),
    }
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        best = min(host_us(lambda _: fn(), [None], n=300) for _ in range(5))
        rows.append(dict(what=name, host_us=best))
        log(rows[-1])
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 gpu/host_overhead.py")
    p.add_argument("--cpu", action="store_true", help="CPU-only host glue and reference rows")
    p.add_argument(
        "--only",
        default="kernels,layer,direct,cached",
        help="sections, comma-separated: kernels, layer, direct, cached",
    )
    args = p.parse_args(argv)
    log = lambda row: print(
        {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()},
        flush=True,
    )
    if args.cpu:
        rows = cpu_glue(log)
        print("\n| what | host us per call (CPU) |\n| --- | ---: |")
        for r in rows:
            print(f"| {r['what']} | {r['host_us']:.1f} |")
        return
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device (or --cpu)")
    out_dir = os.environ.get("OUT", "runs/gpu/host_overhead")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    parts = args.only.split(",")
    if "kernels" in parts:
        kernel_section(rows, log)
    if "layer" in parts:
        layer_section(rows, log)
    if "direct" in parts:
        direct_launch_probe(rows, log)
    if "cached" in parts:
        cached_launch_section(rows, log)
    meta = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        seconds=round(time.time() - T0, 1),
        n_calls=N_CALLS,
    )
    with open(os.path.join(out_dir, "host_overhead.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f"\n{meta}\n\n{table(rows)}")


if __name__ == "__main__":
    main()
