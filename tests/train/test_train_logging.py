"""What a run shows and logs: diagnostics on the interval's steps, val_loss on the terminal,
Megatron's start-up warnings reduced to one note; the step line, parameter count and summary.

    test_diagnostics_val_loss_and_quiet_start    one CPU run (6 steps, diagnostics every 3,
        metrics every 2, eval every 3), read back from its offline W&B run file:
        diag/ keys on steps 3 and 6 exactly (3 is not a log step), every key of the recipe;
        `val_loss` on the terminal at steps 3 and 6; one note instead of Megatron's warnings
    test_show_warnings_brings_them_back          UFP4_SHOW_WARNINGS=1
    test_filters_hide_only_megatrons_noise_and_keep_showwarning   warnings.filterwarnings
        keyed on module and message: Megatron's noise only; showwarning is Python's own
    test_a_mistyped_show_warnings_is_refused     UFP4_SHOW_WARNINGS=yes: error, exit 2
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

from _cli import FAST, ROOT, env, run, without_package

from ufp4_megatron.report.wandb_offline import find_run_file, read_run
from ufp4_megatron.train.logs.quiet import NOTE

LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
# UFP4 quantizes both operands of all three GEMMs: (GEMM, operand) pairs
OPERANDS = ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x")
STATS = ("alpha", "sqnr_db", "bucket_ratio", "delta_sqnr_db")
MEGATRON_NOISE = ("not installed", "IS DEPRECATED", "is deprecated", "absl")


def _env_with_warnings(tmp, **extra):
    e = env(tmp)
    e.pop("PYTHONWARNINGS")  # the CLI's own filtering is what is tested
    return e | extra


def test_diagnostics_val_loss_and_quiet_start(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        *FAST,
        "precision=ufp4",
        "train.steps=6",
        f"hydra.run.dir={run_dir}",
        f"data.cache_dir={tmp_path / 'c'}",
        "logging.wandb.mode=offline",
        "logging.wandb.diagnostics_interval=3",
        "logging.wandb.diagnostics_layers=[1]",
        "logging.log_interval=2",
        "logging.print_interval=100",
        "train.eval_interval=3",
        "train.eval_iters=1",
    ]
    r = subprocess.run(
        cmd, cwd=ROOT, env=_env_with_warnings(tmp_path), capture_output=True, text=True, timeout=400
    )
    assert r.returncode == 0, r.stderr[-3000:]

    history = read_run(find_run_file(run_dir))["history"]
    diag_steps = [h["_step"] for h in history if any(k.startswith("diag/") for k in h)]
    assert diag_steps == [3, 6]
    expected = {
        f"diag/layer1.{lin}/{op}/{stat}" for lin in LINEARS for op in OPERANDS for stat in STATS
    }
    for h in history:
        if h["_step"] in diag_steps:
            keys = {k for k in h if k.startswith("diag/")}
            assert keys == expected
            assert all(math.isfinite(h[k]) for k in keys)
    assert {h["_step"] for h in history} == {2, 3, 4, 6}  # log steps + diagnostics steps
    logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").open()]
    assert logged == [2, 4, 6]

    val_lines = [
        line for line in r.stdout.splitlines() if line.startswith("step") and "val_loss" in line
    ]
    assert [int(line.split()[1]) for line in val_lines] == [3, 6]
    assert all(math.isfinite(float(line.split("val_loss ")[1].split()[0])) for line in val_lines)
    # Megatron-LM's --log-throughput fields, and the plain lines' elapsed time and ETA
    for part in ("step 6 of 6 |", "ms/it", "TFLOP/s/GPU", "rss", "elapsed", "ETA 0:00:00"):
        assert part in val_lines[-1], val_lines[-1]
    assert "MFU" not in r.stdout  # no peak on a CPU: left out, not guessed
    assert "parameters (" in r.stdout  # the count at start
    assert r.stdout.strip().splitlines()[-1].startswith("done: steps 1-6 of 6 in ")
    assert r.stdout.strip().endswith(f"run dir {run_dir}")

    assert r.stderr.count(NOTE) == 1
    rest = (r.stdout + r.stderr).replace(NOTE, "")
    assert not [w for w in MEGATRON_NOISE if w in rest], r.stderr[-3000:]


def test_show_warnings_brings_them_back(tmp_path):
    code = (
        "from ufp4_megatron.train.logs.quiet import hide_megatron_noise\n"
        "hide_megatron_noise()\n"
        "import megatron.core.optimizer, megatron.core.hyper_comm_grid\n"
    )
    # Megatron warns when absl is missing; the test extra installs it (with tensorboard)
    warn = {"PYTHONWARNINGS": "default", **without_package(tmp_path, "absl")}
    quiet = run([sys.executable, "-c", code], tmp_path, env_extra=warn)
    shown = run(
        [sys.executable, "-c", code], tmp_path, env_extra={"UFP4_SHOW_WARNINGS": "1", **warn}
    )
    assert quiet.returncode == shown.returncode == 0, quiet.stderr + shown.stderr
    assert "not installed" not in quiet.stderr and quiet.stderr.count(NOTE) == 1
    assert "Transformer Engine and Apex are not installed" in shown.stderr
    assert "absl.logging is not installed" in shown.stderr and NOTE not in shown.stderr


FILTERS = """\
import io, sys, warnings
from contextlib import redirect_stderr
from ufp4_megatron.train.logs.quiet import hide_megatron_noise
before = warnings.showwarning
hide_megatron_noise()
hide_megatron_noise()  # idempotent: one note, one set of filters
assert warnings.showwarning is before, "warnings.showwarning replaced"
def issue(module, message):
    exec("import warnings; warnings.warn(%r)" % message, {"__name__": module})
issue("megatron.core.fake", "Apex is not installed. Falling back to torch")
issue("ufp4_megatron.megatron.cpu_compat", "x is deprecated")
issue("megatron.core.fake", "a real problem")            # Megatron, but not noise: shown
issue("mylib.module", "mylib is not installed")           # noise words, not Megatron: shown
issue("megatronish.x", "foo is deprecated")               # a look-alike module: shown
"""


def test_filters_hide_only_megatrons_noise_and_keep_showwarning(tmp_path):
    r = run([sys.executable, "-c", FILTERS], tmp_path, env_extra={"PYTHONWARNINGS": "default"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(NOTE) == 1
    assert "Falling back" not in r.stderr and "x is deprecated" not in r.stderr
    for shown in ("a real problem", "mylib is not installed", "foo is deprecated"):
        assert shown in r.stderr, r.stderr


def test_a_mistyped_show_warnings_is_refused(tmp_path):
    r = run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.train",
            *FAST,
            "train.steps=1",
            f"hydra.run.dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'c'}",
        ],
        tmp_path,
        env_extra={"UFP4_SHOW_WARNINGS": "yes"},
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "error: UFP4_SHOW_WARNINGS='yes': give 1 (show Megatron's start-up warnings) or 0 "
        "(hide them behind one note, the default)"
    )
    assert not (tmp_path / "run").exists()
