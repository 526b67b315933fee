"""Checkpoint conversion between the trainer's layout and Megatron-LM's
(python -m ufp4_megatron.cli.convert_checkpoint, train/checkpoint_megatron_lm.py).

The round trip trainer -> Megatron-LM -> trainer continues the unbroken run exactly (every
tensor, the SR stream, the optimizer, the LR schedule, the RNG and the step carried); the
Megatron-LM layout is loaded as Megatron-LM's load_checkpoint loads it, into the model
pretrain_gpt.py builds with the plugin's spec (tests/megatron_lm/probe.py); bad input is
refused in one line and never overwrites anything.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from _cli import ROOT, losses, own_stderr, run, train_cmd

from ufp4_megatron.train import checkpoint_megatron_lm as conv

PROBE = ROOT / "tests" / "megatron_lm" / "probe.py"
STEPS = ["train.steps=6", "checkpoint.interval=3", "checkpoint.keep=0"]


def convert(tmp: Path, to: str, src: Path, dst: Path, *extra: str):
    return run(
        [
            sys.executable,
            "-m",
            "ufp4_megatron.cli.convert_checkpoint",
            "--to",
            to,
            *extra,
            str(src),
            str(dst),
        ],
        tmp,
        timeout=180,
    )


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    """6 steps of the tiny model, checkpoints at 3 and 6, all kept."""
    tmp = tmp_path_factory.mktemp("mlm-conv")
    run_dir, cache = tmp / "a", tmp / "cache"
    res = run(train_cmd(run_dir, cache, *STEPS), tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp, run_dir, cache


@pytest.fixture(scope="module")
def converted(unbroken):
    tmp, run_dir, _ = unbroken
    dst = tmp / "mlm"
    res = convert(tmp, "megatron-lm", run_dir / "checkpoints" / "step_00000003", dst)
    assert res.returncode == 0, res.stderr[-3000:]
    return dst


def test_megatron_lm_layout_tracker_and_common_state(unbroken, converted):
    assert (converted / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert sorted(p.name for p in converted.iterdir()) == [
        "iter_0000003",
        "latest_checkpointed_iteration.txt",
    ]
    assert (converted / "iter_0000003" / "metadata.json").is_file()


def _probe(tmp: Path, case: dict, kind: str = "load_converted") -> dict:
    import megatron.core  # the wheel's megatron/training stands in for the checkout's

    wheel = Path(megatron.core.__file__).resolve().parents[2]
    path = tmp / "case.json"
    path.write_text(json.dumps(case))
    res = run(
        [sys.executable, str(PROBE), kind, str(path)],
        tmp,
        timeout=300,
        env_extra={"PYTHONPATH": os.pathsep.join([str(ROOT), str(wheel)])},
        cwd=wheel,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("PROBE_JSON ")]
    assert lines, res.stdout[-2000:] + res.stderr[-4000:]
    return json.loads(lines[-1][len("PROBE_JSON ") :])


def pretrain_gpt_argv(layers: int = 2) -> list[str]:
    """pretrain_gpt.py's flags for the tiny model (conv.model_flags) and the trainer's batch."""
    identity = {
        "model": {
            "num_layers": layers,
            "hidden_size": 128,
            "ffn_hidden_size": 352,
            "num_attention_heads": 4,
            "num_query_groups": 2,
            "rotary_base": 10000,
            "max_seq_len": 1024,
            "untie_embeddings": True,
            "kv_channels": None,
        }
    }
    return [
        *conv.model_flags(identity),
        "--seq-length",
        "32",
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "2",
        "--train-iters",
        "6",
        "--lr",
        "3e-4",
        "--mock-data",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "383",
        "--transformer-impl",
        "local",
        "--attention-backend",
        "unfused",
        "--no-rope-fusion",
        "--no-gradient-accumulation-fusion",
        "--no-masked-softmax-fusion",
        "--no-bias-swiglu-fusion",
        "--no-bias-dropout-fusion",
        "--no-persist-layer-norm",
        "--use-distributed-optimizer",
        "--spec",
        "ufp4_megatron.megatron.spec",
        "ufp4_gpt_spec",
    ]


def test_megatron_lm_load_checkpoint_reads_it_into_pretrain_gpt_model(unbroken, converted):
    tmp, run_dir, _ = unbroken
    out = _probe(
        tmp,
        {
            "argv": pretrain_gpt_argv(),
            "env": {"UFP4_RECIPE": "ufp4"},
            "load": str(converted),
            "source": str(run_dir / "checkpoints" / "step_00000003"),
        },
    )
    assert out["stage"] == "ok", out
    assert (out["iteration"], out["release"], out["dir"], out["format"]) == (
        3,
        False,
        "iter_0000003",
        "torch_dist",
    )
    assert {
        "args",
        "checkpoint_version",
        "iteration",
        "opt_param_scheduler",
        "optimizer",
        "num_floating_point_operations_so_far",
        "content_metadata",
    } <= set(out["common_keys"])
    assert out["consumed_train_samples"] == 3 * 2 and out["iteration_in_state"] == 3
    sched = out["opt_param_scheduler"]  # samples: steps x global batch 2
    assert (sched["num_steps"], sched["lr_warmup_steps"], sched["lr_decay_steps"]) == (6, 4, 12)
    assert out["no_save_rng"] is True  # saved on CPU: no CUDA generator to restore
    assert out["missing"] == []
    assert out["model_sum"] == pytest.approx(out["source_sum"], rel=1e-12, abs=1e-9)
    assert len(out["sr_draws"]) == 1 and out["sr_draws"][0] != "0"  # the stream carried


def test_a_mismatched_model_is_refused_by_megatron_lm(unbroken, converted):
    out = _probe(
        unbroken[0], {"argv": pretrain_gpt_argv(layers=3), "env": {}, "load": str(converted)}
    )
    assert out["stage"] == "args" and "num_layers value from checkpoint (2)" in out["error"]


def test_round_trip_continues_the_unbroken_run_exactly(unbroken, converted):
    tmp, run_dir, cache = unbroken
    resumed = tmp / "b"
    resumed.mkdir()
    res = convert(tmp, "ufp4", converted, resumed / "ckpt")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (resumed / "ckpt" / "latest").read_text() == "3"
    assert (resumed / "ckpt" / "step_00000003" / "integrity.json").is_file()
    res = run(train_cmd(resumed, cache, *STEPS, f"checkpoint.dir={resumed / 'ckpt'}"), tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    assert losses(resumed) == losses(run_dir)[3:]


# -- bad input: refused before anything is written ----------------------------------------


def _mlm_dir(tmp: Path, tracker: str | None, iters=(3,)) -> Path:
    d = tmp / "src"
    d.mkdir()
    if tracker is not None:
        (d / conv.TRACKER).write_text(tracker)
    for i in iters:
        (conv.iter_dir(d, i)).mkdir()
    return d


@pytest.mark.parametrize(
    "tracker, says",
    [
        ("hello\n", "not an iteration number"),
        ("", "not an iteration number"),
        ("9" * 70, "not an iteration number"),
        ("release", "release checkpoint"),
        ("7", "iter_0000007 does not exist"),
        (None, "is missing or not a regular file"),
    ],
)
def test_bad_trackers_are_refused(tmp_path, tracker, says):
    src = _mlm_dir(tmp_path, tracker)
    with pytest.raises(conv.ConversionError, match=says):
        conv.megatron_lm_source(src)


def test_symlinked_iter_dir_and_tracker_are_refused(tmp_path):
    src = _mlm_dir(tmp_path, "3", iters=())
    real = tmp_path / "elsewhere"
    real.mkdir()
    os.symlink(real, conv.iter_dir(src, 3))
    with pytest.raises(conv.ConversionError, match="symbolic link"):
        conv.megatron_lm_source(src)
    (src / conv.TRACKER).unlink()
    os.symlink(tmp_path / "t", src / conv.TRACKER)
    (tmp_path / "t").write_text("3")
    with pytest.raises(conv.ConversionError, match="not a regular file"):
        conv.megatron_lm_source(src)


def test_an_iter_dir_without_a_torch_dist_checkpoint_is_refused(tmp_path):
    src = _mlm_dir(tmp_path, "3")
    with pytest.raises(conv.ConversionError, match=r"no metadata\.json"):
        conv.megatron_lm_source(src)


def test_the_wrong_direction_is_named(tmp_path):
    (tmp_path / "t" / "step_00000003").mkdir(parents=True)
    with pytest.raises(conv.ConversionError, match=r"trainer's layout.*--to megatron-lm"):
        conv.megatron_lm_source(tmp_path / "t")
    src = _mlm_dir(tmp_path, "3")
    with pytest.raises(conv.ConversionError, match=r"Megatron-LM's layout.*--to ufp4"):
        conv.ufp4_source(src)


def test_a_dir_without_steps_is_refused(tmp_path):
    with pytest.raises(conv.ConversionError, match="holds no step_NNNNNNNN dir"):
        conv.ufp4_source(tmp_path)


def test_existing_destination_is_refused_and_left_alone(unbroken, converted, tmp_path):
    tmp, run_dir, _ = unbroken
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.txt").write_text("mine")
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    for dst in (tmp_path / "dst", tmp_path / "link"):
        res = convert(tmp, "megatron-lm", run_dir / "checkpoints", dst)
        lines = own_stderr(res.stderr)
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
        assert "already exists" in lines[0], lines
    assert os.listdir(tmp_path / "dst") == ["keep.txt"] and not (tmp_path / "nowhere").exists()
    res = convert(tmp, "ufp4", tmp_path / "missing", tmp_path / "new")
    assert res.returncode == 2 and "no such checkpoint dir" in res.stderr
    assert not (tmp_path / "new").exists()


@pytest.fixture(scope="module")
def saved_by_megatron_lm(unbroken):
    """Megatron-LM's generate_state_dict and dist_checkpointing.save for the model
    pretrain_gpt.py builds, after 3 iterations (probe kind save_megatron_lm)."""
    tmp = unbroken[0]
    argv = [a for a in pretrain_gpt_argv() if a != "--use-distributed-optimizer"]
    argv += [
        "--min-lr",
        "3e-5",
        "--lr-warmup-iters",
        "2",
        "--lr-decay-style",
        "cosine",
        "--weight-decay",
        "0.1",
        "--clip-grad",
        "1.0",
        "--adam-beta2",
        "0.95",
    ]
    src = tmp / "written-by-megatron-lm"
    out = _probe(
        tmp,
        {"argv": argv, "env": {"UFP4_RECIPE": "ufp4"}, "save": str(src), "iterations": 3},
        kind="save_megatron_lm",
    )
    assert out["stage"] == "ok", out
    return src, argv, out["weights_sum"]


def test_a_checkpoint_saved_as_megatron_lm_saves_continues_in_the_trainer(
    unbroken, saved_by_megatron_lm
):
    """Converted (its real args Namespace read back restricted); a start with another model
    is refused before step 1 and pins nothing; the trainer then continues with the same
    model, data position and schedule."""
    tmp, _, cache = unbroken
    src, _, _ = saved_by_megatron_lm
    run_dir = tmp / "from-mlm"
    run_dir.mkdir()
    res = convert(tmp, "ufp4", src, run_dir / "ckpt")
    assert res.returncode == 0, res.stderr[-3000:]
    trainer = [
        "train.steps=5",
        "parallel.distributed_optimizer=false",
        f"checkpoint.dir={run_dir / 'ckpt'}",
    ]
    res = run(train_cmd(run_dir, cache, *trainer, "model.hidden_size=64"), tmp)
    assert (
        res.returncode == 2
        and "holds another model: its embedding.word_embeddings"
        ".weight is [384, 128], this run's [384, 64]"
        in res.stderr
    ), res.stderr[-2000:]
    res = run(train_cmd(run_dir, cache, *trainer), tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from step 3" in res.stdout
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 5]
    # the schedule continues Megatron-LM's (cosine, warmup 2, decay over --train-iters 6,
    # 3 iterations done), not this config's (decay over train.steps=5: 9.75e-05 at step 4)
    assert rows[0]["lr"] == pytest.approx(3e-5 + 2.7e-4 * 0.5 * (1 + math.cos(math.pi / 2)))


@pytest.mark.slow  # ~60 s: two conversions and a probe; the round trip above covers the rest
def test_megatron_lm_to_trainer_and_back_loads_in_megatron_lm(unbroken, saved_by_megatron_lm):
    """Without a trainer run in between, the way back restores Megatron-LM's own args."""
    tmp = unbroken[0]
    src, argv, weights_sum = saved_by_megatron_lm
    res = convert(tmp, "ufp4", src, tmp / "there")
    assert res.returncode == 0, res.stderr[-3000:]
    res = convert(tmp, "megatron-lm", tmp / "there", tmp / "back")
    assert res.returncode == 0, res.stderr[-3000:]
    out = _probe(tmp, {"argv": argv, "env": {"UFP4_RECIPE": "ufp4"}, "load": str(tmp / "back")})
    assert out["stage"] == "ok", out
    assert (out["iteration"], out["consumed_train_samples"], out["missing"]) == (3, 6, [])
    assert out["opt_param_scheduler"]["num_steps"] == 6
    assert out["model_sum"] == pytest.approx(weights_sum, rel=1e-12, abs=1e-9)


def test_model_only_leaves_the_optimizer_out_and_says_so(unbroken):
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict
    from torch.distributed.checkpoint import FileSystemReader

    tmp, run_dir, _ = unbroken
    res = convert(tmp, "megatron-lm", run_dir / "checkpoints", tmp / "model-only", "--model-only")
    assert res.returncode == 0 and "--no-load-optim" in res.stdout, res.stderr[-2000:]
    path = tmp / "model-only" / "iter_0000006"
    common = load_common_state_dict(str(path))
    assert "optimizer" not in common and "opt_param_scheduler" not in common
    assert common["args"].no_save_optim is True
    keys = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    assert not [k for k in keys if k.startswith("optimizer.")]
    assert "output_layer.weight" in keys
