"""Compile the QDQ kernels for an H200 (sm_90, CUDA) on a machine without a GPU.

Run as a script by test_compile_sm90.py, in a subprocess whose environment has no
TRITON_INTERPRET: the kernels must be decorated as real JIT functions (the CPU tests'
conftest turns them into interpreted ones), and Triton's CUDA backend then compiles them
through TTIR, TTGIR, LLVM IR and PTX to a cubin with the ptxas bundled in its wheel. The
interpreter runs kernel bodies as Python, so code it accepts may still fail that compiler (a
module constant annotated `X: tl.constexpr = 3` did: `broken_kernel` below).

Each case drives a real entry point (ops, grouped_ops) with small CPU tensors. The first
kernel launch of the call is intercepted at `JITFunction.run`, which is where Triton itself
turns a launch into a compilation: its arguments go through Triton's own binder (signature,
integer and alignment specialisation, constexprs) and `triton.compile` for
GPUTarget("cuda", 90, 32), as a launch on an H200 would. So the constexprs (tiles, warps,
SCALE, SR, EXACT_DIV, SEG, ...) are those dispatch.py's plans pass, not a copy. Nothing runs:
the call ends at the intercepted launch.

    python tests/kernels/sm90_compile.py [CASE ...]    one JSON line per case (its TTGIR's
                                     values per thread and layout conversions among them)
    python tests/kernels/sm90_compile.py --sass [CASE ...]
                                     the same, each with its SASS instruction, register and
                                     barrier counts (cuobjdump), then a table; with no CASE,
                                     also the SASS-only cases (the single-layout kernels of
                                     UFP4 and E2M1): the static counts docs/kernel-notes.md
                                     quotes
    python tests/kernels/sm90_compile.py --interpret   run broken_kernel in the interpreter
"""

import collections
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

H200 = GPUTarget("cuda", 90, 32)

# The failure class this test exists for: the interpreter reads the annotated module
# constant as a plain 3, the compiler refuses a global that is not a tl.constexpr instance.
BROKEN_X: tl.constexpr = 3


@triton.jit
def broken_kernel(out_ptr):
    tl.store(out_ptr + tl.arange(0, 4), tl.full((4,), BROKEN_X, tl.int32))


class Launched(Exception):
    """Raised by an intercepted launch: the kernel and its launch arguments."""

    def __init__(self, kernel, args, kwargs):
        super().__init__(kernel.__name__)
        self.kernel, self.args, self.kwargs = kernel, args, kwargs


class Interceptor:
    """Replaces `run` of the given JIT functions (JITFunction.__getitem__ launches through
    self.run): `launch(call, index)` returns launch `index` (0: the first) of `call`; the
    launches before it do nothing (their outputs stay uninitialised), that one ends the call."""

    def __init__(self, kernels):
        self._skip = 0
        for kernel in kernels:
            kernel.run = functools.partial(self._run, kernel)

    def _run(self, kernel, *args, grid, warmup, **kwargs):
        if self._skip:
            self._skip -= 1
            return None
        raise Launched(kernel, args, kwargs)

    def launch(self, call, index=0) -> Launched:
        self._skip = index
        try:
            call()
        except Launched as launch:
            return launch
        raise AssertionError(f"the call made {index - self._skip} launches, fewer than {index + 1}")


def compile_launch(kernel, args, kwargs):
    """triton.compile of one launch for the H200, its arguments bound the way
    JITFunction.run binds them (runtime/jit.py, triton 3.6), without asking a driver."""
    kwargs = dict(
        kwargs,
        debug=kwargs.get("debug", kernel.debug) or triton.knobs.runtime.debug,
        instrumentation_mode=triton.knobs.compilation.instrumentation_mode,
    )
    backend = make_backend(H200)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound, specialization, options
    )
    src = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=H200, options=options.__dict__), signature


# ----------------------------------------------------------------------------- the cases
# name: (kernel it must reach, which launch of the call, the call). Each drives a real entry
# point with small bf16 CPU tensors (sizes multiples of 16: a launch on real layers
# specialises its integer arguments the same way); `s` holds the modules, recipes and tensors.
BROKEN = "broken: annotated module constant"
CASES = {
    # ufp4 fprop, x: e1m2, RTNE, RHT16, row layout (grouped: one launch per operand)
    "row16 ufp4 fprop x rtne": (
        "_row16_kernel",
        0,
        lambda s: s.grouped.fprop(s.x, s.w3, s.groups, s.ufp4, **s.kw),
    ),
    # ufp4 dgrad, dy over two experts: SR, row layout, per-expert SR keys (row segments)
    "row16 ufp4 grouped dgrad dy sr segments": (
        "_row16_kernel",
        0,
        lambda s: s.grouped.dgrad(s.dy, s.w3, s.groups, s.ufp4, **s.kw),
    ),
    # ufp4 wgrad, dy^T over two experts: SR, column layout, column segments
    "col16 ufp4 grouped wgrad dy sr segments": (
        "_col16_kernel",
        0,
        lambda s: s.grouped.wgrad(s.dy, s.x, s.groups, s.ufp4, **s.kw),
    ),
    # mxfp4's grouped wgrad dy: 1x32 column blocks keyed per expert (segments start at
    # multiples of 32: the experts' tokens are padded to the wgrad unit)
    "col32 mxfp4 grouped wgrad dy sr segments": (
        "_col16_kernel",
        0,
        lambda s: s.grouped.wgrad(s.dy_mx, s.x_mx, s.groups_mx, s.mxfp4, **s.kw),
    ),
    # ufp4 dgrad, dy (row, SR) and w (column, RTNE) in one launch
    "pair16 ufp4 dgrad dy sr + w col rtne": (
        "_pair16_kernel",
        0,
        lambda s: s.ops.dgrad(s.dy, s.w, s.ufp4, **s.kw),
    ),
    # mxfp4 wgrad, dy^T and x^T: 1x32 blocks (two groups of 16), e8m0 scales, RHT16, SR on
    # dy, column layout, one launch
    "pair16 mxfp4 wgrad dy col32 sr + x col32": (
        "_pair16_kernel",
        0,
        lambda s: s.ops.wgrad(s.dy, s.x, s.mxfp4, **s.kw),
    ),
    # mxfp4 dgrad: dy's 1x32 rows (generic, SR), then w^T's 1x32 columns (16-tensor, RTNE)
    "generic mxfp4 dgrad dy row sr": (
        "_qdq_kernel",
        0,
        lambda s: s.ops.dgrad(s.dy, s.w, s.mxfp4, **s.kw),
    ),
    "col32 mxfp4 dgrad w col rtne": (
        "_col16_kernel",
        1,
        lambda s: s.ops.dgrad(s.dy, s.w, s.mxfp4, **s.kw),
    ),
    # nvfp4 fprop, w: 16x16 tiles, e4m3 scales, row layout (launches of a first call: the
    # tensor amax of x, of w, then x through row16, then w)
    "generic nvfp4 fprop w 2d e4m3": (
        "_qdq_kernel",
        3,
        lambda s: s.ops.fprop(s.x, s.w, s.nvfp4, **s.kw),
    ),
    # nvfp4 dgrad, w: 16x16 tiles in the column layout (the transposed tile; a 2D block
    # reduction that reshapes a broadcast compiles to a layout replicating the tile in every
    # thread, for many minutes)
    "generic nvfp4 dgrad w col 2d e4m3": (
        "_qdq_kernel",
        3,
        lambda s: s.ops.dgrad(s.dy, s.w, s.nvfp4, **s.kw),
    ),
    # the e4m3 tensor amax (amax_triton.py): nvfp4's x (1x16, row), its w in the column
    # layout with 16x16 tiles (dgrad), its dY^T in the column layout with RHT16 (wgrad)
    "amax nvfp4 fprop x row": (
        "_tensor_amax_kernel",
        0,
        lambda s: s.ops.fprop(s.x, s.w, s.nvfp4, **s.kw),
    ),
    "amax nvfp4 dgrad w col 2d": (
        "_tensor_amax_kernel",
        1,
        lambda s: s.ops.dgrad(s.dy, s.w, s.nvfp4, **s.kw),
    ),
    "amax16 nvfp4 wgrad dy col rht16": (
        "_tensor_amax16_kernel",
        0,
        lambda s: s.ops.wgrad(s.dy, s.x, s.nvfp4, **s.kw),
    ),
    # both layouts' tensor amax of nvfp4's dY in one read: dgrad's row layout, wgrad's
    # column layout with RHT16 (ops.tensor_amaxes), through the 16-tensor layout
    "amax pair16 nvfp4 dy row + col rht16": (
        "_tensor_amax_pair16_kernel",
        0,
        lambda s: s.ops.tensor_amaxes("dy", s.dy, s.nvfp4, **s.kw),
    ),
    # the generic pair kernel: a rotated row layout (no recipe's; an operand format of one)
    "amax pair generic row rht16 + col": (
        "_tensor_amax_pair_kernel",
        0,
        lambda s: s.amax_pair(s.dy, s.e4m3_fmt(rht=s.rht16), s.e4m3_fmt()),
    ),
    # both layouts' tensor amax of nvfp4's w in one pass: its 16x16 tiles, the same in both,
    # read in the row layout (ops.tensor_amaxes)
    "amax pair nvfp4 w 2d": (
        "_tensor_amax_kernel",
        0,
        lambda s: s.ops.tensor_amaxes("w", s.w, s.nvfp4, **s.kw),
    ),
    # nvfp4's grouped experts: a tensor scale per expert (segments, SCALE 1 with SEG): the
    # amax per row segment by atomic max (x, row segments) and per block column (w^T in dgrad,
    # dy^T in wgrad),
    # and the QDQ kernels reading each block's segment scale
    "amax nvfp4 grouped fprop x per row": (
        "_tensor_amax_kernel",
        0,
        lambda s: s.grouped.fprop(s.x, s.w3, s.groups, s.nvfp4, **s.kw),
    ),
    # x's per-expert amax for fprop and wgrad in one read, reduced per expert by atomic max
    # (grouped_ops.input_amaxes)
    "amax pair16 nvfp4 grouped x per expert": (
        "_tensor_amax_pair16_kernel",
        0,
        lambda s: s.grouped.input_amaxes("x", s.x, s.groups, s.nvfp4, **s.kw),
    ),
    "row16 nvfp4 grouped fprop x e4m3 segments": (
        "_row16_kernel",
        1,
        lambda s: s.grouped.fprop(s.x, s.w3, s.groups, s.nvfp4, **s.kw),
    ),
    "generic nvfp4 grouped fprop w 2d e4m3 segments": (
        "_qdq_kernel",
        3,
        lambda s: s.grouped.fprop(s.x, s.w3, s.groups, s.nvfp4, **s.kw),
    ),
    "amax nvfp4 grouped dgrad w col 2d per block column": (
        "_tensor_amax_kernel",
        2,
        lambda s: s.grouped.dgrad(s.dy, s.w3, s.groups, s.nvfp4, **s.kw),
    ),
    "generic nvfp4 grouped dgrad w col 2d e4m3 segments": (
        "_qdq_kernel",
        3,
        lambda s: s.grouped.dgrad(s.dy, s.w3, s.groups, s.nvfp4, **s.kw),
    ),
    "amax16 nvfp4 grouped wgrad dy col rht16 per block column": (
        "_tensor_amax16_kernel",
        0,
        lambda s: s.grouped.wgrad(s.dy, s.x, s.groups, s.nvfp4, **s.kw),
    ),
    "col16 nvfp4 grouped wgrad dy sr e4m3 segments": (
        "_col16_kernel",
        1,
        lambda s: s.grouped.wgrad(s.dy, s.x, s.groups, s.nvfp4, **s.kw),
    ),
    # SR keys read from device memory (SEED_PTR: a key table's entry, megatron/seeds.py's
    # GPU draws), in the pair kernel and the generic kernel, and the draw kernel itself
    "pair16 ufp4 dgrad dy sr device key + w col rtne": (
        "_pair16_kernel",
        0,
        lambda s: s.ops.dgrad(s.dy, s.w, s.ufp4, seed=s.keys, **s.kw),
    ),
    "generic mxfp4 dgrad dy row sr device key": (
        "_qdq_kernel",
        0,
        lambda s: s.ops.dgrad(s.dy, s.w, s.mxfp4, seed=s.keys, **s.kw),
    ),
    "pair16 mxfp4 wgrad col32 device key": (
        "_pair16_kernel",
        0,
        lambda s: s.ops.wgrad(s.dy, s.x, s.mxfp4, seed=s.keys, **s.kw),
    ),
    # a host seed of 1: Triton's binder passes an integer argument equal to 1 as a constexpr
    # (the interpreter never does), and the Philox rounds must take that seed too
    "row16 ufp4 dy sr seed 1": (
        "_row16_kernel",
        0,
        lambda s: s.quantize_view(s.dy, "e1m2", block=16, rht=s.rht16, rounding="sr", seed=1),
    ),
    "draw keys 64 experts": ("_draw_keys_kernel", 0, lambda s: s.draw(64)),
    "draw keys plain linear": ("_draw_keys_kernel", 0, lambda s: s.draw(None)),
    # the failure class, compiled the same way: must raise
    BROKEN: ("broken_kernel", 0, lambda s: broken_kernel[(1,)](torch.zeros(4, dtype=torch.int32))),
}


def _view_call(grid, rht, rounding, col):
    """kernels.quantize_view of s.x (or its transpose: the column layout) in one format."""

    def call(s):
        from ufp4_megatron.kernels import quantize_view
        from ufp4_megatron.numerics.hadamard import get_rht

        view = s.x.t() if col else s.x
        rot = None if rht is None else get_rht(rht, 0)
        return quantize_view(view, grid, block=16, rht=rot, rounding=rounding, seed=3)

    return call


# Compiled only for --sass: the single-layout 16-tensor kernels of UFP4 (e1m2, RHT16) and
# E2M1 (binade rounding; RHT16 on wgrad's operands only), RTNE and SR, as one quantize_view
# of a plain operand launches them; the pair kernels of the CASES above are GEMMs' launches.
SASS_CASES = {
    f"{kernel[1:-7]} {name} {rounding}": (kernel, 0, _view_call(grid, rht, rounding, col))
    for kernel, col in (("_row16_kernel", False), ("_col16_kernel", True))
    for name, grid, rht in (
        ("e1m2 rht16", "e1m2", 16),
        ("e2m1", "e2m1", None),
        ("e2m1 rht16", "e2m1", 16),
    )
    for rounding in ("rtne", "sr")
} | {
    "pair16 ufp4 fprop x + w rtne": (
        "_pair16_kernel",
        0,
        lambda s: s.ops.fprop(s.x, s.w, s.ufp4, **s.kw),
    ),
    "pair16 ufp4 wgrad dy sr + x col rtne": (
        "_pair16_kernel",
        0,
        lambda s: s.ops.wgrad(s.dy, s.x, s.ufp4, **s.kw),
    ),
    "pair16 e2m1 fprop": ("_pair16_kernel", 0, lambda s: s.ops.fprop(s.x, s.w, s.e2m1, **s.kw)),
    "pair16 e2m1 dgrad": ("_pair16_kernel", 0, lambda s: s.ops.dgrad(s.dy, s.w, s.e2m1, **s.kw)),
    "pair16 e2m1 wgrad (rht16)": (
        "_pair16_kernel",
        0,
        lambda s: s.ops.wgrad(s.dy, s.x, s.e2m1, **s.kw),
    ),
}


def _setting():
    from ufp4_megatron.kernels import quantize_view, tensor_amax_pair
    from ufp4_megatron.megatron import seeds
    from ufp4_megatron.numerics.hadamard import get_rht
    from ufp4_megatron.numerics.quantize import OperandFormat
    from ufp4_megatron.quant import grouped_ops, ops
    from ufp4_megatron.quant.recipe import get_recipe

    seeds.DEVICE_DRAWS.add("cpu")  # the draw kernel's launch, intercepted like the others

    def draw(experts):
        return seeds.SRSeeds(5).draw(
            3,
            2**32 - 7,
            0,
            1,
            device=torch.device("cpu"),
            experts=None if experts is None else (8, experts),
        )

    ufp4 = get_recipe("ufp4")
    groups = grouped_ops.ExpertGroups((16, 32), align=grouped_ops.token_alignment(ufp4))
    M, N, K = groups.padded_total, 64, 64
    mxfp4 = get_recipe("mxfp4")
    groups_mx = grouped_ops.ExpertGroups((16, 32), align=grouped_ops.token_alignment(mxfp4))
    bf = dict(dtype=torch.bfloat16)
    return types.SimpleNamespace(
        ops=ops,
        grouped=grouped_ops,
        ufp4=ufp4,
        e2m1=get_recipe("e2m1"),
        mxfp4=mxfp4,
        nvfp4=get_recipe("nvfp4"),
        groups=groups,
        groups_mx=groups_mx,
        x_mx=torch.randn(groups_mx.padded_total, K, **bf),
        dy_mx=torch.randn(groups_mx.padded_total, N, **bf),
        kw=dict(backend="triton"),
        x=torch.randn(M, K, **bf),
        dy=torch.randn(M, N, **bf),
        w=torch.randn(N, K, **bf),
        w3=torch.randn(2, N, K, **bf),
        keys=torch.arange(6, dtype=torch.int64)[:, None],
        draw=draw,
        quantize_view=quantize_view,
        rht16=get_rht(16, 0),
        amax_pair=tensor_amax_pair,
        e4m3_fmt=lambda **kw: OperandFormat("e2m1", block=16, scale="e4m3", **kw),
    )


LINEAR = re.compile(r"#ttg\.linear<\{register = (\[\]|\[\[.*?\]\])")


def values_per_thread(ttgir: str) -> int:
    """The most values one thread holds in any linear layout of the kernel: 2^(register
    bases). A tile the compiler spreads over the CTA holds tile / threads; a layout that
    replicates the tile in every thread holds all of it (and unrolls the math over it)."""
    # "[[0, 1], [0, 2]]": one "[" per basis and the list's own
    return max((2 ** (m.group(1).count("[") - 1) for m in LINEAR.finditer(ttgir)), default=1)


def run_case(interceptor, setting, name, sass=False):
    from ufp4_megatron.quant import ops, weight_cache

    want, index, call = (CASES | SASS_CASES)[name]
    # each case from a cold start: an earlier case's kept weight operands or operand plans
    # (ops._PLANS) would change which launches this call makes, and so launch `index`
    weight_cache.invalidate()
    ops._PLANS.clear()
    t0 = time.perf_counter()
    launch = interceptor.launch(lambda: call(setting), index)
    assert launch.kernel.__name__ == want, (
        f"{name}: expected a launch of {want}, got {launch.kernel.__name__}"
    )
    compiled, signature = compile_launch(launch.kernel, launch.args, launch.kwargs)
    consts = {k: v for k, v in launch.kwargs.items() if k in signature}
    counts = sass_counts(compiled.asm["cubin"]) if sass else {}
    return dict(
        kernel=want,
        cubin_bytes=len(compiled.asm["cubin"]),
        values_per_thread=values_per_thread(compiled.asm["ttgir"]),
        layout_conversions=compiled.asm["ttgir"].count("ttg.convert_layout"),
        elf=compiled.asm["cubin"][:4] == b"\x7fELF",
        target=compiled.metadata.target.arch,
        num_warps=compiled.metadata.num_warps,
        fp_fusion=compiled.metadata.enable_fp_fusion,
        constexprs={k: v for k, v in consts.items() if isinstance(v, (int, float))},
        seconds=round(time.perf_counter() - t0, 2),
        **counts,
    )


SASS_LINE = re.compile(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def sass_counts(cubin: bytes) -> dict:
    """Static counts of a cubin (cuobjdump from Triton's wheel): its SASS instructions
    (NOP padding excluded), the most frequent opcodes (modifiers dropped) and its registers
    per thread. Static: every branch counts, taken or not (the fast division's scalar
    fallback, for one, rarely runs)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass, res = (
            subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout
            for flag in ("-sass", "-res-usage")
        )
    ops = collections.Counter(m.group(1) for m in map(SASS_LINE.match, sass.splitlines()) if m)
    del ops["NOP"]
    return dict(
        sass=sum(ops.values()),
        barriers=ops["BAR"],
        regs=int(re.search(r"REG:(\d+)", res).group(1)),
        top_ops=dict(ops.most_common(10)),
    )


def _describe(e: BaseException) -> str:
    """The outermost error's type and the innermost cause's text: a CompilationError wraps
    one per inlined call, the innermost points at the offending line."""
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    return f"{type(e).__name__}: {root}"


def main(argv):
    if argv == ["--interpret"]:
        assert os.environ.get("TRITON_INTERPRET") == "1", "--interpret needs TRITON_INTERPRET=1"
        out = torch.zeros(4, dtype=torch.int32)
        broken_kernel[(1,)](out)
        print(json.dumps(dict(interpreted=out.tolist())))
        return
    assert not os.environ.get("TRITON_INTERPRET"), "compile with TRITON_INTERPRET unset"
    from ufp4_megatron.kernels import dispatch, keys_triton
    from ufp4_megatron.kernels import quantize16_triton as k16

    interceptor = Interceptor(
        (
            k16._row16_kernel,
            k16._col16_kernel,
            k16._pair16_kernel,
            dispatch._qdq_kernel,
            dispatch._tensor_amax_kernel,
            dispatch._tensor_amax_pair_kernel,
            dispatch._tensor_amax_pair16_kernel,
            dispatch._tensor_amax16_kernel,
            keys_triton._draw_keys_kernel,
            broken_kernel,
        )
    )
    # Every launch is intercepted before anything runs, so CPU tensors stand in for CUDA ones.
    dispatch.check_device = lambda x: None
    sass = argv[:1] == ["--sass"]
    names = argv[1:] if sass else argv
    names = names or list(CASES) + (list(SASS_CASES) if sass else [])
    setting = _setting()
    rows = []
    for name in names:
        try:
            row = run_case(interceptor, setting, name, sass=sass)
        except Exception as e:  # reported per case; the test says which failed and why
            row = dict(error=_describe(e))
        rows.append(dict(case=name, **row))
        print(json.dumps(rows[-1]), flush=True)
    if sass:
        print(
            "\n| case (sm_90, 4 warps) | SASS instructions | registers | barriers | "
            "layout conversions |\n| --- | ---: | ---: | ---: | ---: |"
        )
        for row in rows:
            if "sass" in row:
                print(
                    f"| {row['case']} | {row['sass']} | {row['regs']} | {row['barriers']} | "
                    f"{row['layout_conversions']} |"
                )


if __name__ == "__main__":
    main(sys.argv[1:])
