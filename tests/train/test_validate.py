"""Bad trainer input ends in one line saying what to change, exit status 2, nothing written.

The table runs in-process through the trainer's own pre-check (tests/train/_config.py: the
composition and train/validate.py's checked_config, the calls `python -m ufp4_megatron.train`
makes before it writes anything), milliseconds a row; a sample of rows and the cases that need
the environment run the real CLI in a subprocess (about a second each: each fails before
Megatron is imported).

    test_trainer_refuses_bad_config          one row per case: the override(s), the message
    test_the_cli_refuses_in_one_line         a sample of the rows, end to end: exit 2, one
                                             `error:` line, no run dir, no cache
    test_data_refused_at_the_start_leaves_nothing   data.corpus_max_bytes=100: one document,
                                             no validation split; found when the data is
                                             built, the run dir is then removed again
    test_trainer_refuses_layouts_the_world_cannot_hold   WORLD_SIZE as torchrun sets it
    test_device_cuda_without_gpu_is_refused  on a machine without a GPU
    test_describe_refuses_with_the_trainers_message      the same check, the same words
"""

from __future__ import annotations

import sys

import pytest
import torch
from _cli import run, without_package
from _config import refusal

TINY = [
    "model=tiny",
    "train.seq_len=32",
    "train.micro_batch=2",
    "train.global_batch=2",
    "logging.wandb.mode=disabled",
]

CASES = [  # (overrides, a fragment of the one-line message)
    (["train.micro_batch=0"], "train.micro_batch=0 must be >= 1"),
    (["logging.log_interval=0"], "logging.log_interval=0 must be >= 1"),
    (["logging.print_interval=0"], "logging.print_interval=0 must be >= 1"),
    (["train.seq_len=0"], "train.seq_len=0 must be >= 1"),
    (["train.global_batch=0"], "train.global_batch=0 must be >= 1"),
    (["train.steps=0"], "train.steps=0 must be >= 1"),
    (["train.steps=-1"], "train.steps=-1 must be >= 1"),
    (["train.global_batch=3"], "train.global_batch=3 is not a multiple of train.micro_batch=2"),
    (["train.seq_len=2048"], "train.seq_len=2048 exceeds model.max_seq_len=1024"),
    (["train.seed=-1"], "train.seed=-1 must be in [0, 2**31)"),
    (["data.valid_seed=-3"], "data.valid_seed=-3 must be in [0, 2**31)"),
    (["train.eval_interval=2", "train.eval_iters=0"], "evaluate at least 1 batch"),
    (["train.eval_interval=-1"], "train.eval_interval=-1 must be >= 0"),
    # evaluation is on by default: a split with nothing held out is refused before training
    (
        ["data.split='100,0,0'"],
        "data.split='100,0,0' gives the validation split no data, but "
        "train.eval_interval=1000 evaluates on it",
    ),
    (["train.device=tpu"], "train.device='tpu'; valid: auto, cpu, cuda"),
    (["train.dtype=fp16"], "train.dtype='fp16'; valid: auto, bf16, fp32"),
    (
        ["model.num_query_groups=3"],
        "model.num_query_groups=3 must divide model.num_attention_heads=4",
    ),
    (
        ["model.hidden_size=130"],
        "model.hidden_size=130 is not a multiple of model.num_attention_heads=4",
    ),
    (["model.num_layers=0"], "model.num_layers=0 must be >= 1"),
    (
        ["logging.wandb.diagnostics_interval=2", "logging.wandb.diagnostics_layers=[5]"],
        "logging.wandb.diagnostics_layers=[5]: give layer indices in [0, 2)",
    ),
    (["logging.wandb.diagnostics_layers=[-1]"], "diagnostics_layers=[-1]"),
    (["logging.wandb.diagnostics_interval=-2"], "diagnostics_interval=-2 must be >= 0"),
    (["logging.wandb.mode=cloud"], "logging.wandb.mode='cloud'; valid:"),
    (["logging.progress=fancy"], "logging.progress='fancy'; valid: auto, bar, plain"),
    (["logging.peak_tflops=0"], "logging.peak_tflops=0.0 must be > 0 (the GPU's dense BF16 peak"),
    (["logging.peak_tflops=nan"], "logging.peak_tflops=nan must be a finite number > 0"),
    (["optim.lr=-0.001"], "optim.lr=-0.001 must be > 0"),
    (["optim.min_lr=1.0"], "optim.min_lr=1.0 must be in [0, optim.lr=0.0003]"),
    (["optim.warmup_steps=-5"], "optim.warmup_steps=-5 must be >= 0"),
    (["optim.beta2=1.0"], "optim.beta2=1.0 must be in [0, 1)"),
    (["optim.eps=0"], "optim.eps=0.0 must be > 0"),
    (["optim.clip_grad=-1"], "optim.clip_grad=-1.0 must be >= 0"),
    (["parallel.tp=3"], "parallel.tp=3 does not divide model.num_attention_heads=4"),
    (
        ["model.ffn_hidden_size=351", "parallel.tp=2"],
        "parallel.tp=2 does not divide model.ffn_hidden_size=351; use a tp that divides it",
    ),
    (
        [
            "model.hidden_size=96",
            "model.num_attention_heads=12",
            "model.num_query_groups=6",
            "parallel.tp=4",
        ],
        "parallel.tp=4 and model.num_query_groups=6: one must divide the other",
    ),
    (["parallel.pp=3"], "parallel.pp=3 does not divide model.num_layers=2"),
    (["parallel.ep=2"], "parallel.ep=2 needs an MoE model"),
    (["model=moe_small", "parallel.ep=3"], "parallel.ep=3 does not divide model.num_experts=8"),
    (["parallel.sp=true"], "parallel.sp=true needs parallel.tp > 1"),
    (["parallel.tp=0"], "parallel.tp=0 must be >= 1"),
    (["parallel.backend=mpi"], "parallel.backend='mpi'; valid: auto, nccl, gloo"),
    (["precision.recipe=fp3"], "precision.recipe='fp3' is not a recipe; valid:"),
    (["precision.bf16_layers.end=3"], "precision.bf16_layers start=0 end=3"),
    (["optim.adam_kernel=apex"], "optim.adam_kernel='apex'; valid: auto, fused, foreach"),
    # what Hydra cannot compose (train/overrides.py): Hydra's words, in one line
    (
        ["train.stepz=3"],
        "Could not override 'train.stepz'. To append to your config use "
        "+train.stepz=3 (Key 'stepz' not in 'TrainConfig')",
    ),
    (
        ["train.steps=many"],
        "Error merging override train.steps=many (Value 'many' of type "
        "'str' could not be converted to Integer)",
    ),
    (["precision.rht.fprop=maybe"], "Value 'maybe' is not a valid bool"),
    (
        ["parallel.tp=1.5"],
        "parallel.tp=1.5 (Value '1.5' of type 'float' could not be converted to Integer)",
    ),
    (
        ["model=huge"],
        "In 'config': Could not find 'model/huge'; Available options in "
        "'model': dense_1p5b, moe_124b, moe_7p9b, moe_small, small, study11m, tiny",
    ),
    (["train.steps=3,4"], "Ambiguous value for argument 'train.steps=3,4'"),
    # Hydra's own hint for a typo ('+' appends) would add a key nothing reads
    (
        ["+train.stepz=3"],
        "train.stepz is not a key of the training config, so nothing would read it",
    ),
    (["+foo=1"], "check the spelling: the top level has experiment, model, precision"),
    # reported as deep tracebacks: now one line before anything is written
    (["model.kv_channels=7"], "model.kv_channels=7 is odd: RoPE rotates pairs of channels"),
    (["data.split='0,0,0'"], "data.split='0,0,0' gives the training split no data"),
    (["data.split='a,b,c'"], "data.split='a,b,c': give up to three non-negative weights"),
    (["data.corpus_max_bytes=0"], "data.corpus_max_bytes=0 must be >= 1"),
    (["model.attention_backend=bogus"], "model.attention_backend='bogus'; valid: sdpa, te"),
    (["model.sdpa_kernels=[bogus]"], "model.sdpa_kernels=['bogus']: give SDPA kernels from"),
    (["data.tokenizer.type=bogus"], "data.tokenizer.type='bogus'; valid: byte-level"),
    (["train.steps=1e10"], "Value '10000000000.0' of type 'float' could not be converted"),
    (["train.steps=10000000000"], "train.steps=10000000000 must be < 2**31"),
    (
        ["~precision"],
        "precision is not set; the trainer has no default for it (`~precision` "
        "removes the group): choose one of bf16, e2m1",
    ),
    # silently wrong before (NaN losses with exit 0, a save at every step)
    (["optim.weight_decay=nan"], "optim.weight_decay=nan must be a finite number >= 0"),
    (["model.init_std=nan"], "model.init_std=nan must be a finite number in (0, 1]"),
    (["optim.lr=inf"], "optim.lr=inf must be a finite number > 0"),
    (["model.rotary_base=0"], "model.rotary_base=0 must be >= 2"),
    (["checkpoint.interval=-1"], "checkpoint.interval=-1 must be >= 0"),
    # new cases: typos, attackers and surprises of the same classes
    (
        ["model.hidden_size=130", "model.num_attention_heads=2", "model.num_query_groups=2"],
        "the head dim model.hidden_size / model.num_attention_heads = 130 / 2=65 is odd",
    ),
    (["data.split='98,-2,0'"], "data.split='98,-2,0': give up to three non-negative weights"),
    (["data.split='1e2,1,0'"], "data.split='1e2,1,0': give up to three"),
    (["data.split='98,1,1,1'"], "data.split='98,1,1,1': give up to three"),
    (
        ["data.split='100,0,0'", "train.eval_interval=5"],
        "gives the validation split no data, but train.eval_interval=5 evaluates on it",
    ),
    (["model.sdpa_kernels=[]"], "model.sdpa_kernels=[]: give SDPA kernels"),
    (
        ["model.attention_backend=megatron", "model.sdpa_kernels=[flash]"],
        "model.sdpa_kernels=['flash'] applies to model.attention_backend=sdpa, not megatron",
    ),
    (["data.prefixes=['  ']"], "data.prefixes=['  '] holds an empty prefix"),
    (
        ["data.corpus_bpe_vocab=100"],
        "data.corpus_bpe_vocab=100: a byte-level BPE needs at least 257 tokens",
    ),
    (
        ["data=embedded_bpe", "data.prefixes=[x]"],
        "data.corpus_bpe_vocab=8192 trains a BPE on the embedded corpus, but data.prefixes is set",
    ),
    (["data.cache_dir=''"], "data.cache_dir='' is empty, which would mean the current directory"),
    (["checkpoint.dir=' '"], "checkpoint.dir=' ' is empty"),
    (["train.device=' cpu'"], "train.device=' cpu'; valid: auto, cpu, cuda"),
    (["train.dtype='bf16\u00a0'"], "train.dtype='bf16\\xa0'; valid: auto, bf16, fp32"),
    (["train.dtype=bf16\u00a0"], "LexerNoViableAltException: train.dtype=bf16"),  # Hydra's
    (["precision.rht.seed=-1"], "precision.rht.seed=-1 must be in [0, 2**63)"),
    (
        ["model.hidden_size=1000000"],
        "needs about 100,631 GiB per process for its weights, gradients and optimizer state alone",
    ),
    (
        ["train.deterministic=true", "model.cross_entropy_fusion=true"],
        "train.deterministic=true with model.cross_entropy_fusion=true",
    ),
    (
        ["train.deterministic=true", "model.sdpa_kernels=[cudnn]"],
        "cuDNN attention has no deterministic backward",
    ),
]


def _refused(r, fragment: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in r.stdout + r.stderr
    return lines[0]


def _train(tmp_path, *overrides: str, **env: str):
    cmd = [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        *TINY,
        f"hydra.run.dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *overrides,
    ]
    return run(cmd, tmp_path, env_extra=env)


@pytest.mark.usefixtures("hydra_configs")
@pytest.mark.parametrize("overrides,fragment", CASES, ids=["+".join(o) for o, _ in CASES])
def test_trainer_refuses_bad_config(overrides, fragment):
    line = refusal([*TINY, *overrides])
    assert line is not None and "\n" not in line, line
    assert fragment in line, line


def test_the_precheck_leaves_hydra_interpolations_to_hydra():
    """${hydra:run.dir} resolves only inside a Hydra run: the pre-check composes without one
    and must not resolve it (docs/data.md's per-run cache), while a '???' is still named."""
    from ufp4_megatron.train.overrides import composed

    cfg, problem = composed([*TINY, "data.cache_dir=${hydra:run.dir}/data-cache"])
    assert problem is None and cfg is not None
    _, problem = composed([*TINY, "data.cache_dir=${hydra:run.dir}/x", "~precision"])
    assert problem.startswith("precision is not set"), problem


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        (["optim.lr=inf"], "error: optim.lr=inf must be a finite number > 0"),
        (["~precision"], "error: precision is not set"),
        (["train.stepz=3"], "Could not override 'train.stepz'"),
        (["data.split='a,b,c'"], "give up to three non-negative weights"),
        (
            ["train.deterministic=true"],
            "CUBLAS_WORKSPACE_CONFIG=':0:0' in the environment is not a deterministic setting",
        ),
    ],
)
def test_the_cli_refuses_in_one_line(tmp_path, overrides, fragment):
    env = {"CUBLAS_WORKSPACE_CONFIG": ":0:0"} if "deterministic" in overrides[0] else {}
    _refused(_train(tmp_path, *overrides, **env), fragment)
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_compose_errors_see_the_users_config_dir(tmp_path):
    """--config-dir joins the check as it joins Hydra: its groups are options, its typos
    are refused in one line like the package's own."""
    (tmp_path / "mine" / "model").mkdir(parents=True)
    (tmp_path / "mine" / "model" / "wide.yaml").write_text(
        "defaults:\n  - tiny\n  - _self_\nhidden_sizze: 256\n"
    )
    r = run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.train",
            "--config-dir",
            str(tmp_path / "mine"),
            "model=wide",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
    )
    _refused(r, "hidden_sizze")
    r = run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.train",
            f"--config-dir={tmp_path / 'mine'}",
            "model=wider",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
    )
    _refused(r, "Could not find 'model/wider'; Available options in 'model': dense_1p5b")


@pytest.mark.parametrize(
    "group", ["model", "precision", "data", "optim", "train", "parallel", "logging", "checkpoint"]
)
def test_every_shipped_config_has_only_schema_keys(group):
    """Each option of each config group composes with no key outside the schema (the check
    above would refuse a shipped config otherwise); free-form dicts are exempt."""
    from pathlib import Path

    from ufp4_megatron.configs import CONFIG_DIR
    from ufp4_megatron.train.overrides import compose_problem

    options = sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))
    assert options, group
    for option in options:
        assert compose_problem([f"{group}={option}"]) is None, f"{group}={option}"
    assert compose_problem(["precision=ufp4", "+precision.overrides.fprop.x.grid=e2m1"]) is None


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["model=tiny", "train.steps=3"], (["model=tiny", "train.steps=3"], None)),
        (["--config-dir", "d", "model=x"], (["model=x"], "d")),
        (["-cd", "d", "model=x"], (["model=x"], "d")),
        (["--config-dir=d", "model=x"], (["model=x"], "d")),
        (["--config-dir"], None),  # Hydra says what is missing
        (["-m", "train.steps=3,4"], None),  # a sweep: Hydra's multirun
        (["--cfg", "job"], None),
        (["--help"], None),
    ],
)
def test_which_command_lines_are_checked_first(argv, expected):
    from ufp4_megatron.train.overrides import precheckable

    assert precheckable(argv) == expected


def test_data_refused_at_the_start_leaves_nothing(tmp_path):
    r = _train(tmp_path, "data.corpus_max_bytes=100")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors == r.stderr.strip().splitlines()[-1:], r.stderr
    assert "data.split='98,2,0' leaves the valid split of " in errors[0]
    assert "(1 documents) empty; use more data or change data.split" in errors[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "world,overrides,fragment",
    [
        (
            "3",
            ["parallel.tp=2"],
            "3 processes do not divide into parallel.tp * parallel.pp = 2 * 1",
        ),
        ("2", ["parallel.dp=4"], "parallel.dp=4 but 2 processes / (tp * pp) give dp=2"),
        (
            "1",
            ["model=moe_small", "parallel.ep=2"],
            "parallel.ep=2 does not divide the data-parallel size 1",
        ),
        (
            "2",
            ["train.global_batch=2", "train.micro_batch=2"],
            "train.global_batch=2 must be a multiple of train.micro_batch * data-parallel size = 2 * 2",
        ),
        ("2", ["parallel.pp=2"], "parallel.pp=2 runs on GPU only"),
    ],
)
def test_trainer_refuses_layouts_the_world_cannot_hold(tmp_path, world, overrides, fragment):
    # WORLD_SIZE as torchrun exports it; the check runs before the process group is made
    _refused(_train(tmp_path, *overrides, WORLD_SIZE=world), fragment)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_device_cuda_without_gpu_is_refused(tmp_path):
    _refused(
        _train(tmp_path, "train.device=cuda"),
        "train.device=cuda but no CUDA device is visible here",
    )


@pytest.mark.parametrize(
    "overrides", [["model=tiny", "parallel.tp=3"], ["model=moe_124b", "parallel.ep=7"]]
)
def test_describe_refuses_with_the_trainers_message(tmp_path, overrides):
    d = run([sys.executable, "-m", "ufp4_megatron.cli.describe", *overrides], tmp_path)
    assert "total_params" not in d.stdout
    line = _refused(d, "does not divide")
    t = _train(tmp_path, *overrides)
    assert _refused(t, "does not divide") == line


def test_tensorboard_asked_for_but_missing_is_one_line(tmp_path):
    # the test extra installs tensorboard: a stand-in that fails to import hides it
    _refused(
        _train(tmp_path, "logging.tensorboard=true", **without_package(tmp_path, "tensorboard")),
        "logging.tensorboard=true needs the tensorboard package, which is not installed",
    )
    assert not (tmp_path / "run").exists()
