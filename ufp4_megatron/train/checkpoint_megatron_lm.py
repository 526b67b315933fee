"""Conversion between the trainer's checkpoint layout and Megatron-LM's, both ways.

Both are Megatron-Core dist_checkpointing (`torch_dist`) directories of the same model and
optimizer classes (a GPTModel with the plugin's spec; get_megatron_optimizer), so their
tensors carry the same keys: the model's (`decoder.layers.*.weight`, each UFP4 linear's
`_extra_state` holding the SR-seed stream) and the optimizer's. They differ in the directory
layout and in the small state around the tensors:

    trainer                                   Megatron-LM (megatron/training/checkpointing.py)
    <dir>/step_00000120/ + integrity.json     <dir>/iter_0000120/
    <dir>/latest: "120"                       <dir>/latest_checkpointed_iteration.txt: "120"
    ufp4.step                                 iteration, checkpoint_version 3.0, args
    ufp4.lr_schedule (steps)                  opt_param_scheduler (samples: steps x batch)
    ufp4.rng, one per (pp, tp, dp) rank       rng_state, one [state] per (pp, tp)
    ufp4.policy (the SR-seed stream)          (only in the linears' _extra_state)
    ufp4.layout, ufp4.run                     args (tp, pp, dp, world size, batch, samples)

A conversion reads every entry of the source with dist_checkpointing (every pickle restricted
to plain data, train/trust.py), keeps each tensor and linear state byte for byte under
its key, translates the state around them, and writes the destination in one process. It
creates the destination dir itself and removes it again if the conversion fails, so an
existing path is never written into.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from . import checkpoint, trust

TRACKER = "latest_checkpointed_iteration.txt"
ITER_DIR = re.compile(r"iter_(\d{7,})")  # iter_%07d
COMMON = "common_state"  # dist_checkpointing's own object holding the common state
CHECKPOINT_VERSION = 3.0  # what Megatron-LM's generate_state_dict writes
_RNG_KEYS = {
    "random": "random_rng_state",
    "numpy": "np_rng_state",
    "torch": "torch_rng_state",
    "cuda": "cuda_rng_state",
    "tracker": "rng_tracker_states",
}
_SCHEDULE_COUNTS = (
    "num_steps",
    "lr_warmup_steps",
    "lr_decay_steps",
    "wd_incr_steps",
    "wsd_decay_steps",
)  # counted in steps here, in samples by Megatron-LM


class ConversionError(checkpoint.CheckpointError):
    """A source that cannot be converted as asked; the message says what to change."""


def iter_dir(root: Path, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


# -- finding the source ----------------------------------------------------------------------


def read_tracker(root: Path) -> int:
    """The iteration Megatron-LM's tracker file names (read as read_metadata reads it)."""
    tracker = Path(root) / TRACKER
    if checkpoint.steps_on_disk(root) or checkpoint.STEP_DIR.fullmatch(Path(root).name):
        raise ConversionError(
            f"{root} is a checkpoint of the trainer's layout (step_N dirs): "
            "convert it with --to megatron-lm"
        )
    if tracker.is_symlink() or not tracker.is_file():
        raise ConversionError(
            f"{tracker} is missing or not a regular file: {root} is not a "
            "Megatron-LM checkpoint dir (give the dir that holds it, or an "
            "iter_NNNNNNN dir)"
        )
    with open(tracker, "rb") as f:
        raw = f.read(65)
    text = raw.decode("ascii", "replace").strip()
    if text == "release":
        raise ConversionError(
            f"{tracker} says 'release' (a weights-only release checkpoint "
            "with no iteration, optimizer or schedule): not a training run "
            "to continue"
        )
    if not text.isdigit() or len(raw) > 64:
        raise ConversionError(
            f"{tracker} holds {text[:24]!r}, not an iteration number: "
            "write the iteration of an iter_NNNNNNN dir there, or give "
            "that dir itself"
        )
    return int(text)


def megatron_lm_source(src: Path) -> tuple[Path, int]:
    """(the iter dir to read, its iteration) for a Megatron-LM checkpoint dir or iter dir."""
    src = Path(src)
    m = ITER_DIR.fullmatch(src.name)
    if m and not (src / TRACKER).exists():
        path, iteration = src, int(m.group(1))
    else:
        iteration = read_tracker(src)
        path = iter_dir(src, iteration)
    if path.is_symlink():
        raise ConversionError(
            f"{path} is a symbolic link (to {os.readlink(path)}): copy the "
            "checkpoint it names and convert the copy"
        )
    if not path.is_dir():
        raise ConversionError(
            f"{path} does not exist, though {src / TRACKER} names "
            f"iteration {iteration}: restore it, or point the tracker at "
            "an iter dir that exists"
        )
    why = _torch_dist_problem(path)
    if why:
        raise ConversionError(f"{path} is not a complete torch_dist checkpoint: {why}")
    return path, iteration


def ufp4_source(src: Path) -> Path:
    """The step dir to read: `src` itself, or the newest intact step of a checkpoint dir,
    its checksums verified."""
    src = Path(src)
    if checkpoint.STEP_DIR.fullmatch(src.name):
        why = checkpoint.damage(src)
        if why:
            raise ConversionError(f"{src} is not a complete checkpoint: {why}")
        path = src
    else:
        if (src / TRACKER).exists() or ITER_DIR.fullmatch(src.name):
            raise ConversionError(
                f"{src} is a checkpoint of Megatron-LM's layout: convert it with --to ufp4"
            )
        if not checkpoint.steps_on_disk(src):
            raise ConversionError(
                f"{src} holds no step_NNNNNNNN dir: give a trainer's "
                "checkpoint dir (<run dir>/checkpoints) or one of its step "
                "dirs"
            )
        found = checkpoint.find(src)
        if found.step is None:
            raise ConversionError(f"no intact checkpoint in {src}: " + "; ".join(found.skipped))
        path = checkpoint.step_dir(src, found.step)
        for line in found.skipped:  # a newer step that is damaged: said, not silently passed
            print(f"warning: {line}; converting {path} instead", file=sys.stderr)
    manifest = trust.read(path)
    if manifest is not None:
        why = trust.verify_share(path, manifest, 0, 1)
        if why:
            raise ConversionError(f"{path} is damaged: {why}")
    return path


def _torch_dist_problem(path: Path) -> str | None:
    import json

    config = path / "metadata.json"
    if not config.is_file():
        return (
            "no metadata.json (Megatron-LM's legacy torch format or an empty dir; only "
            "--ckpt-format torch_dist checkpoints convert)"
        )
    try:
        backend = json.loads(config.read_bytes()[:4096]).get("sharded_backend")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return "metadata.json is not Megatron's JSON config"
    if backend != "torch_dist":
        return f"metadata.json names backend {backend!r}, not torch_dist"
    if not (path / ".metadata").is_file():
        return "no .metadata (a save that did not finish)"
    return None


# -- reading and writing whole checkpoints in one process ------------------------------------


@dataclass
class Entries:
    """Every entry of a checkpoint: sharded (tensors and objects, by their on-disk key, with
    their global shape and offset) and common (plain values)."""

    tensors: dict  # key -> torch.Tensor (the whole global tensor)
    objects: dict  # key -> {global_offset: (global_shape, value)}
    common: dict


def single_process_group() -> None:
    """dist_checkpointing needs a process group: one gloo rank, on a free local port."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def read_entries(path: Path) -> Entries:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata
    from torch.distributed.checkpoint.api import CheckpointException

    with trust.restricted() as scope:
        try:
            meta = load_sharded_metadata(str(path))
            loaded = dist_checkpointing.load(meta, str(path), validate_access_integrity=False)
        except (Exception, CheckpointException) as e:
            if scope.refused:
                raise checkpoint._tampered(path, scope.refused) from None
            raise ConversionError(f"cannot read {path}: {checkpoint._one_line(e)}") from None
    tensors, objects = {}, {}
    for key, sh in meta.items():
        if isinstance(sh, ShardedTensor):
            if getattr(sh, "flattened_range", None) is not None:
                raise ConversionError(
                    f"{path}: {key} is stored flattened (the deprecated "
                    "fully_sharded_model_space optimizer format)"
                )
            tensors[sh.key] = loaded.pop(key)
        elif isinstance(sh, ShardedObject) and sh.key != COMMON:
            objects.setdefault(sh.key, {})[tuple(sh.global_offset)] = (
                tuple(sh.global_shape),
                loaded.pop(key),
            )
    loaded.pop(key_of_common(), None)
    return Entries(tensors, objects, loaded)


def key_of_common() -> str:
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return ShardedObject(COMMON, None, (1,), (0,)).unique_key


def write_entries(entries: Entries, path: Path, content_metadata: dict | None) -> None:
    """One torch_dist checkpoint at `path` (which must not exist yet) holding `entries`."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    state: dict = dict(entries.common)
    for key, t in entries.tensors.items():
        state[f"t/{key}"] = ShardedTensor.from_rank_offsets(key, t.contiguous(), replica_id=0)
    for key, shards in entries.objects.items():
        for offset, (shape, value) in shards.items():
            state[f"o/{key}/{offset}"] = ShardedObject(key, value, shape, offset, replica_id=0)
    path.mkdir()
    dist_checkpointing.save(
        state,
        str(path),
        get_default_save_sharded_strategy("torch_dist"),
        content_metadata=content_metadata,
    )


# -- the translations ------------------------------------------------------------------------


def _one(entries: Entries, key: str, what: str):
    shards = entries.objects.get(key)
    if not shards:
        raise ConversionError(f"no {key} in the source ({what})")
    if len(shards) != 1:
        raise ConversionError(
            f"{key} has {len(shards)} shards (one per pipeline stage): only "
            "pipeline-parallel size 1 converts"
        )
    return next(iter(shards.values()))[1]


def _identity(common: dict) -> dict:
    run = common.get(f"{checkpoint.PREFIX}.run")
    if not isinstance(run, dict) or not isinstance(run.get("identity"), dict):
        raise ConversionError(
            "the checkpoint does not record its run (saved by an older "
            "ufp4-megatron): resume it once with this version to save a "
            "new step, then convert that"
        )
    return run["identity"]


def schedule_in_samples(sched: dict, batch: int) -> dict:
    return {
        k: (v * batch if k in _SCHEDULE_COUNTS and isinstance(v, int) else v)
        for k, v in sched.items()
    }


def schedule_in_steps(sched: dict, batch: int) -> dict:
    out = {}
    for k, v in sched.items():
        if k in _SCHEDULE_COUNTS and isinstance(v, int):
            if v % batch:
                raise ConversionError(
                    f"opt_param_scheduler.{k}={v} samples is not a whole number of steps of "
                    f"{batch} sequences (--global-batch-size): a run with batch ramp-up or a "
                    "changed batch size does not convert"
                )
            v //= batch
        out[k] = v
    return out


def megatron_lm_args(
    identity: dict, layout: dict, step: int, batch: int, *, has_rng: bool, has_optim: bool
) -> argparse.Namespace:
    """The `args` Megatron-LM's load_checkpoint reads from a checkpoint: what
    check_checkpoint_args compares, the parallel sizes (whether the RNG state is loaded), the
    consumed samples (the data position) and the no_save_* flags (what is absent)."""
    m = identity["model"]
    return argparse.Namespace(
        num_layers=m["num_layers"],
        hidden_size=m["hidden_size"],
        ffn_hidden_size=m["ffn_hidden_size"],
        num_attention_heads=m["num_attention_heads"],
        num_query_groups=m["num_query_groups"],
        max_position_embeddings=m["max_seq_len"],
        padded_vocab_size=m["vocab_size"],
        tensor_model_parallel_size=layout["tp"],
        pipeline_model_parallel_size=layout["pp"],
        expert_model_parallel_size=layout["ep"],
        data_parallel_size=layout["dp"],
        world_size=layout["world_size"],
        use_distributed_optimizer=layout["distributed_optimizer"],
        global_batch_size=batch,
        consumed_train_samples=step * batch,
        skipped_train_samples=0,
        consumed_valid_samples=0,
        iteration=step,
        ckpt_format="torch_dist",
        use_dist_ckpt=True,
        no_save_rng=not has_rng,
        no_save_optim=not has_optim,
        data_parallel_random_init=False,
    )


def to_megatron_lm(src: Path, dst: Path, *, model_only: bool = False) -> dict:
    """A trainer checkpoint (dir or step dir) -> a new Megatron-LM checkpoint dir `dst`."""
    path = ufp4_source(src)
    _fresh(dst)
    e = read_entries(path)
    step = e.common.pop(f"{checkpoint.PREFIX}.step")
    layout = e.common.pop(f"{checkpoint.PREFIX}.layout")
    e.common.pop(f"{checkpoint.PREFIX}.converted_from", None)
    # converted from Megatron-LM and not trained here since: its own args go back
    theirs = e.common.pop(f"{checkpoint.PREFIX}.megatron_lm_args", None)
    if isinstance(theirs, argparse.Namespace) and f"{checkpoint.PREFIX}.run" not in e.common:
        identity, batch = None, int(theirs.global_batch_size)
    else:
        identity = _identity(e.common)
        batch = int(identity["train"]["global_batch"])
    sched = _one(e, f"{checkpoint.PREFIX}.lr_schedule", "the LR schedule")
    e.objects.pop(f"{checkpoint.PREFIX}.lr_schedule")
    e.objects.pop(f"{checkpoint.PREFIX}.policy", None)  # the linears' _extra_state has it
    rng = e.objects.pop(f"{checkpoint.PREFIX}.rng", {})
    # Megatron-LM keeps one RNG state per (pp, tp) rank, the data-parallel rank 0's. A state
    # saved on CPU has no CUDA generator, which Megatron-LM's load requires: it is kept for a
    # way back, and args.no_save_rng tells Megatron-LM not to load it.
    mlm_rng = {
        offset[:2]: (shape[:2], [{_RNG_KEYS[k]: v for k, v in state.items()}])
        for offset, (shape, state) in rng.items()
        if offset[2] == 0
    }
    if mlm_rng:
        e.objects["rng_state"] = mlm_rng
    has_rng = bool(mlm_rng) and all("cuda" in s for _, (_, s) in rng.items())
    content = e.common.pop("content_metadata", None)
    if model_only:
        e.tensors = {k: v for k, v in e.tensors.items() if not k.startswith("optimizer.")}
        e.objects = {k: v for k, v in e.objects.items() if not k.startswith("optimizer.")}
        e.common.pop("optimizer", None)
        content = {k: v for k, v in (content or {}).items() if not k.startswith("distrib_optim")}
    else:
        e.common["opt_param_scheduler"] = schedule_in_samples(sched, batch)
    if identity is None:
        args = argparse.Namespace(**vars(theirs))
        args.__dict__.update(
            iteration=step,
            consumed_train_samples=step * batch,
            no_save_rng=not has_rng,
            no_save_optim=model_only,
        )
    else:
        args = megatron_lm_args(
            identity, layout, step, batch, has_rng=has_rng, has_optim=not model_only
        )
    e.common |= {
        "args": args,
        "checkpoint_version": CHECKPOINT_VERSION,
        "iteration": step,
        "num_floating_point_operations_so_far": 0,
    }
    return _finish(
        dst,
        lambda tmp: write_entries(e, tmp, content),
        iter_dir(dst, step),
        dst / TRACKER,
        str(step),
        step,
        has_rng=has_rng,
        model_only=model_only,
        source=path,
        checksummed=False,
    )


def to_ufp4(src: Path, dst: Path) -> dict:
    """A Megatron-LM checkpoint (dir or iter dir) -> a new trainer checkpoint dir `dst`."""
    path, iteration = megatron_lm_source(src)
    _fresh(dst)
    e = read_entries(path)
    args = e.common.pop("args", None)
    if not isinstance(args, argparse.Namespace):
        raise ConversionError(f"{path} has no Megatron-LM args in its common state")
    step = int(e.common.pop("iteration", iteration))
    batch = int(args.global_batch_size)
    pp, tp = int(args.pipeline_model_parallel_size), int(args.tensor_model_parallel_size)
    if pp != 1:
        raise ConversionError(
            f"{path} was saved with pipeline-parallel size {pp}: only size 1 "
            "converts (the SR-seed stream is kept per pipeline stage)"
        )
    if "optimizer" not in e.common or "opt_param_scheduler" not in e.common:
        raise ConversionError(
            f"{path} holds no optimizer state (saved with --no-save-optim): "
            "the trainer resumes only complete checkpoints"
        )
    streams = {
        repr(v["ufp4_sr_seeds"]): v["ufp4_sr_seeds"]
        for k, shards in e.objects.items()
        if k.endswith("._extra_state")
        for _, (_, v) in shards.items()
        if isinstance(v, dict) and "ufp4_sr_seeds" in v
    }
    if len(streams) != 1:
        raise ConversionError(
            f"{path} holds {'no' if not streams else len(streams)} SR-seed stream"
            f"{'s' if streams else ''} in its linears' extra state (one is written by a UFP4 "
            "model of the --spec or flags route; a BF16 or TransformerEngine-route checkpoint "
            "has none): the trainer cannot continue its stochastic rounding"
        )
    sched = schedule_in_steps(e.common.pop("opt_param_scheduler"), batch)
    content = e.common.pop("content_metadata", None) or {}
    sharding = content.get("distrib_optim_sharding_type")
    dp = int(getattr(args, "data_parallel_size", 1))
    layout = {
        "tp": tp,
        "pp": pp,
        "ep": int(getattr(args, "expert_model_parallel_size", 1)),
        "dp": dp,
        "world_size": int(args.world_size),
        "distributed_optimizer": bool(args.use_distributed_optimizer),
        "optim_sharding": sharding if args.use_distributed_optimizer else None,
    }
    rng = e.objects.pop("rng_state", {})
    if not rng:
        raise ConversionError(
            f"{path} holds no RNG state (saved with --no-save-rng): the "
            "trainer resumes only complete checkpoints"
        )
    ours = {}
    for offset, (_, states) in rng.items():
        state = {k: states[0][v] for k, v in _RNG_KEYS.items() if v in states[0]}
        for d in range(dp):  # the same on every data-parallel rank, as Megatron-LM keeps it
            ours[(*offset, d)] = ((pp, tp, dp), state)
    e.objects[f"{checkpoint.PREFIX}.rng"] = ours
    e.objects[f"{checkpoint.PREFIX}.lr_schedule"] = {(0,): ((1,), sched)}
    e.objects[f"{checkpoint.PREFIX}.policy"] = {
        (0,): ((1,), {"sr_seeds": next(iter(streams.values()))})
    }
    for k in ("checkpoint_version", "num_floating_point_operations_so_far", "rerun_state_machine"):
        e.common.pop(k, None)
    e.common[f"{checkpoint.PREFIX}.step"] = step
    # no trainer config comes with it: the run dir that resumes it records its own
    # (train/rundir/resume_check.py)
    e.common[f"{checkpoint.PREFIX}.converted_from"] = str(path)
    # for the way back (to_megatron_lm) while no trainer run has saved over it
    e.common[f"{checkpoint.PREFIX}.megatron_lm_args"] = args
    e.common[f"{checkpoint.PREFIX}.layout"] = layout
    return _finish(
        dst,
        lambda tmp: write_entries(e, tmp, content or None),
        checkpoint.step_dir(dst, step),
        dst / "latest",
        str(step),
        step,
        has_rng=all("cuda_rng_state" in s[0] for _, (_, s) in rng.items()),
        model_only=False,
        source=path,
        checksummed=True,
    )


def _fresh(dst: Path) -> None:
    if dst.exists() or dst.is_symlink():
        raise ConversionError(
            f"{dst} already exists: give a new path (a conversion never "
            "writes into or over an existing one)"
        )
    if not dst.parent.is_dir():
        raise ConversionError(f"{dst.parent} does not exist: create it first")


def _finish(
    dst: Path,
    write,
    final: Path,
    marker: Path,
    text: str,
    step: int,
    *,
    has_rng: bool,
    model_only: bool,
    source: Path,
    checksummed: bool,
) -> dict:
    """Creates `dst` (refusing one that appeared meanwhile), writes the checkpoint dir beside
    its final name, renames it, then writes the tracker; removes `dst` again on failure."""
    try:
        dst.mkdir()
    except FileExistsError:
        raise ConversionError(f"{dst} already exists: give a new path") from None
    try:
        tmp = final.with_name(final.name + ".saving")
        write(tmp)
        if checksummed:
            checkpoint._write_manifest(tmp)
        for f in tmp.iterdir():
            checkpoint._fsync(f)
        os.replace(tmp, final)
        checkpoint.write_atomic(marker, text)
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise
    return {
        "source": str(source),
        "written": str(final),
        "step": step,
        "rng": has_rng,
        "optimizer": not model_only,
    }


def model_flags(identity: dict) -> list[str]:
    """pretrain_gpt.py flags that build the trainer's model (the local route)."""
    m = identity["model"]
    flags = [
        "--num-layers",
        m["num_layers"],
        "--hidden-size",
        m["hidden_size"],
        "--ffn-hidden-size",
        m["ffn_hidden_size"],
        "--num-attention-heads",
        m["num_attention_heads"],
        "--group-query-attention",
        "--num-query-groups",
        m["num_query_groups"],
        "--swiglu",
        "--normalization",
        "RMSNorm",
        "--disable-bias-linear",
        "--position-embedding-type",
        "rope",
        "--rotary-base",
        m["rotary_base"],
        "--max-position-embeddings",
        m["max_seq_len"],
    ]
    if m.get("kv_channels"):
        flags += ["--kv-channels", m["kv_channels"]]
    if m.get("untie_embeddings", True):
        flags += ["--untie-embeddings-and-output-weights"]
    return [str(f) for f in flags]
