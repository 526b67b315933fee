"""The kernels compile for an H200 (sm_90, CUDA), checked on a CPU-only machine.

The CPU suite runs the kernels in Triton's interpreter, which executes kernel bodies as
Python: code it accepts can still fail the GPU compiler (module constants annotated
`X: tl.constexpr = ...` pass every CPU test and fail to compile for a GPU).
Here each kernel family is compiled for GPUTarget("cuda", 90, 32) with Triton's own
compiler and the ptxas bundled in its wheel, through to a cubin; no GPU or CUDA driver is
needed. The work runs in a subprocess (sm90_compile.py) whose environment has no
TRITON_INTERPRET (conftest.py sets it for this process) and a fresh Triton cache, so every
kernel is really compiled. Launch arguments and constexprs are those the real entry points
pass (sm90_compile.py intercepts the launch), one representative setting per family (make
test compiles the first case of each kernel and the device-key pair16, make test-slow the
rest; gpu/kernels_exact.sh all):

| case                                     | kernel          | setting                          |
| row16 ufp4 fprop x rtne                  | _row16_kernel   | e1m2, RTNE, RHT16, row           |
| row16 ufp4 grouped dgrad dy sr segments  | _row16_kernel   | e1m2, SR, RHT16, row segments    |
| col16 ufp4 grouped wgrad dy sr segments  | _col16_kernel   | e1m2, SR, RHT16, column segments |
| col32 mxfp4 grouped wgrad dy sr segments | _col16_kernel   | e2m1 1x32, e8m0, SR, RHT16, column segments |
| pair16 ufp4 dgrad dy sr + w col rtne     | _pair16_kernel  | row SR + column RTNE, one launch |
| pair16 mxfp4 wgrad dy col32 sr + x col32 | _pair16_kernel  | e2m1 1x32 (two groups of 16), e8m0, RHT16, SR + RTNE, col + col |
| generic mxfp4 dgrad dy row sr            | _qdq_kernel     | e2m1 1x32, e8m0, SR, row         |
| col32 mxfp4 dgrad w col rtne             | _col16_kernel   | e2m1 1x32, e8m0, RTNE, col       |
| generic nvfp4 fprop w 2d e4m3            | _qdq_kernel     | e2m1 16x16, e4m3, RTNE, row      |
| generic nvfp4 dgrad w col 2d e4m3        | _qdq_kernel     | e2m1 16x16, e4m3, RTNE, col      |
| amax nvfp4 fprop x row                   | _tensor_amax_kernel | 1x16, row                    |
| amax nvfp4 dgrad w col 2d                | _tensor_amax_kernel | 16x16 tiles, col             |
| amax16 nvfp4 wgrad dy col rht16          | _tensor_amax16_kernel | 1x16, RHT16, col, 16 register tensors |
| amax pair16 nvfp4 dy row + col rht16     | _tensor_amax_pair16_kernel | 1x16 row and 1x16 RHT16 col, one read |
| amax pair generic row rht16 + col        | _tensor_amax_pair_kernel | 1x16 RHT16 row and 1x16 col, one read |
| amax nvfp4 grouped fprop x per row       | _tensor_amax_kernel | 1x16, row, a max per segment of rows by atomic max |
| row16 nvfp4 grouped fprop x e4m3 segments | _row16_kernel  | e2m1, e4m3 per expert, row segments |
| generic nvfp4 grouped fprop w 2d e4m3 segments | _qdq_kernel | 16x16, e4m3 per expert, row segments |
| amax nvfp4 grouped dgrad w col 2d per block column | _tensor_amax_kernel | 16x16, col, a max per block column |
| generic nvfp4 grouped dgrad w col 2d e4m3 segments | _qdq_kernel | 16x16, e4m3 per expert, column segments |
| amax16 nvfp4 grouped wgrad dy col rht16 per block column | _tensor_amax16_kernel | 1x16, RHT16, col, a max per block column |
| col16 nvfp4 grouped wgrad dy sr e4m3 segments | _col16_kernel | e2m1, SR, RHT16, e4m3 per expert, column segments |
| pair16 ufp4 dgrad dy sr device key + w col rtne | _pair16_kernel | dY's SR key read from a key table (SEED_PTR) |
| generic mxfp4 dgrad dy row sr device key | _qdq_kernel  | 1x32, e8m0, SR key from a key table |
| pair16 mxfp4 wgrad col32 device key      | _pair16_kernel  | 1x32 columns, SR key from a key table |
| row16 ufp4 dy sr seed 1                  | _row16_kernel   | a host seed of 1 (Triton passes it as a constexpr) |
| draw keys 64 experts / plain linear      | _draw_keys_kernel | a call's key table drawn on the device (uint64 splitmix) |

Each compiled kernel also keeps its tile spread over the threads: no layout of its TTGIR
holds more than 32 values per thread (a 16x128 tile over 4 warps is 16 each). The 2D-block
column tiles once held 512-2048 (the tile replicated in every thread), compiled in 18 s to
over 13 minutes per kernel and never let the CUDA run of tests/kernels finish; then 256, in
the expanded mask of the fast division's guard (docs/kernel-notes.md).

test_compile_rejects_annotated_module_constant shows the check can fail: a tiny kernel of
the failure class runs in the interpreter and raises in the same compile path.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton
from sm90_compile import BROKEN, CASES, SASS_LINE

HELPER = Path(__file__).with_name("sm90_compile.py")
REPO = Path(__file__).resolve().parents[2]
COMPILED = [name for name in CASES if name != BROKEN]
# make test compiles the first case of each kernel and the device-key pair (UFP4's dY under
# CUDA graphs), about a third of the compile time; make test-slow the others
_first: dict[str, str] = {}
for _name in COMPILED:
    _first.setdefault(CASES[_name][0], _name)
IN_MAKE_TEST = {*_first.values(), "pair16 ufp4 dgrad dy sr device key + w col rtne"}


def _cases(names) -> list:
    return [
        name if name in IN_MAKE_TEST else pytest.param(name, marks=pytest.mark.slow)
        for name in names
    ]


def _ptxas_missing() -> str | None:
    if "nvidia" not in triton.backends.backends:
        return "the triton install has no NVIDIA backend"
    try:
        triton.knobs.nvidia.ptxas  # noqa: B018 - TRITON_PTXAS_PATH or the wheel's backends/nvidia/bin/ptxas
    except RuntimeError as e:
        return f"the triton wheel has no usable ptxas ({e})"
    return None


def _helper(args, tmp_path, **env) -> list[dict]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TRITON_INTERPRET", "TRITON_ALLOW_NON_CONSTEXPR_GLOBALS")
    }
    clean.setdefault("OMP_NUM_THREADS", "1")
    clean.update(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), **env)
    done = subprocess.run(
        [sys.executable, str(HELPER), *args],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{HELPER.name} {' '.join(args)} failed:\n{done.stderr[-3000:]}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def compiled(request, tmp_path_factory):
    """The cases the selected tests ask for, and BROKEN, compiled in one subprocess:
    {case: its JSON row}."""
    reason = _ptxas_missing()
    if reason:
        pytest.skip(f"cannot compile for sm_90 here: {reason}")
    asked = {
        item.callspec.params.get("case")
        for item in request.session.items
        if item.path == request.path and hasattr(item, "callspec")
    }
    names = [name for name in CASES if name in asked or name == BROKEN]
    rows = _helper(names, tmp_path_factory.mktemp("sm90"))
    return {row["case"]: row for row in rows}


@pytest.mark.parametrize("case", _cases(COMPILED))
def test_kernel_compiles_to_sm90_cubin(compiled, case):
    row = compiled[case]
    if "error" in row:
        pytest.fail(f"{case}: the sm_90 compile failed: {row['error']}", pytrace=False)
    assert row["kernel"] == CASES[case][0]
    assert row["target"] == 90 and row["elf"] and row["cubin_bytes"] > 0, row
    # no multiply fused into the add it feeds: the references round both (kernels/launch.py)
    assert row["fp_fusion"] is False, f"{case}: compiled with floating-point contraction"
    # the amax stores no output cast and the key draw no float values: no INTERP branch
    if row["kernel"] in (
        "_tensor_amax_kernel",
        "_tensor_amax_pair_kernel",
        "_tensor_amax_pair16_kernel",
        "_tensor_amax16_kernel",
        "_draw_keys_kernel",
    ):
        assert "INTERP" not in row["constexprs"]
    else:  # the GPU code path, not the interpreter's
        assert row["constexprs"]["INTERP"] is False
    assert row["values_per_thread"] <= 32, (
        f"{case}: a layout holds {row['values_per_thread']} values per thread (the tile "
        "replicated over threads: slow to compile and to run)"
    )


@pytest.mark.parametrize(
    "case",
    _cases(
        c
        for c in COMPILED
        if CASES[c][0] in ("_row16_kernel", "_col16_kernel", "_pair16_kernel")
        or c == "amax16 nvfp4 wgrad dy col rht16"  # one maximum per program: no reshuffle
    ),
)
def test_16_tensor_kernels_convert_no_layout(compiled, case):
    # Element j of every block lives in its own tensor, all in the data's layout; SR's Philox
    # chain once took Triton's default layout instead, and its 16 uniforms went through shared
    # memory with two barriers each (quantize16_triton._row_counter_like).
    row = compiled[case]
    assert row.get("layout_conversions") == 0, (
        f"{case}: {row.get('layout_conversions')} layout conversions in the TTGIR"
    )


def test_sass_counts_of_a_launched_kernel(tmp_path):
    reason = _ptxas_missing()
    if reason:
        pytest.skip(f"cannot compile for sm_90 here: {reason}")
    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    if not cuobjdump.exists():
        pytest.skip(f"the triton wheel has no {cuobjdump} to list SASS with")
    (row,) = [r for r in _helper(["--sass", "row16 e1m2 rht16 sr"], tmp_path) if "case" in r]
    assert row["kernel"] == "_row16_kernel" and row["constexprs"]["SR"] is True, row
    assert row["sass"] > 500 and 0 < row["regs"] <= 255 and row["top_ops"], row
    # the division guard's program-wide max: one store, one barrier, one load, one barrier
    assert row["barriers"] == 2 and row["layout_conversions"] == 0, row


def test_sass_lines_past_address_ffff_count():
    # cuobjdump writes an address of more than four hex digits past 64 KiB of code (4096
    # instructions); a four-digit pattern silently stopped counting there
    for address in ("0000", "fff0", "10000", "1a2b0"):
        line = f"        /*{address}*/                   IMAD.HI.U32 R41, R44, -0x2daee0ad, RZ ;"
        assert SASS_LINE.match(line).group(1) == "IMAD"
    predicated = "        /*10a0*/              @!P4 FADD R41, R41, 1 ;"
    assert SASS_LINE.match(predicated).group(1) == "FADD"


def test_compile_rejects_annotated_module_constant(compiled, tmp_path):
    # the interpreter accepts the kernel and reads the constant as 3 ...
    (run,) = _helper(["--interpret"], tmp_path, TRITON_INTERPRET="1")
    assert run["interpreted"] == [3, 3, 3, 3]
    # ... the compile path every case above takes refuses it, naming the constant
    error = compiled[BROKEN].get("error", "")
    assert error.startswith("CompilationError") and "BROKEN_X" in error, compiled[BROKEN]
