"""Checkpoints: Megatron's dist_checkpointing, written atomically, resumed exactly, trusted
only as far as they are checked.

One format on GPU and CPU (the Runtime's, train/runtime.py). A checkpoint holds everything
that decides the next step's loss: the model, the optimizer (sharded as Megatron-LM shards
it), the LR scheduler, the step (the data position, see data.py), each rank's RNG streams
(torch, CUDA on GPU, numpy, random, Megatron's tracker) and the SR-seed stream; and, to say
whose it is, the run that wrote it (owner(): run id, identity, run dir). Layout:

    <dir>/step_00000120/          one torch_dist checkpoint (metadata.json, .metadata, *.distcp)
                                  and integrity.json, the sha256 of each file (trust.py)
    <dir>/latest                  "120": the newest complete step, written last
    <dir>/step_00000130.saving/   a save in progress (or killed): never read, removed by the next

A save writes into `step_N.saving`; once every rank has written (its files fsynced by
Megatron's writer) the ranks hash their own files and rank 0 writes the manifest, fsyncs the
rest, renames the dir to `step_N`, then writes `latest` (temp file, fsync, rename). A kill at
any point leaves the previous steps intact; a save the filesystem refuses (full, read-only)
stops the run with the OS's reason and leaves them intact too. Resume reads the newest
*intact* step dir (its metadata readable, every file as long as the metadata says and, at
load, as its checksum says), warns about any newer damaged one, refuses another run's
checkpoint (check_owner) and layout changes that Megatron's formats cannot reshard
(check_layout). Every pickle in a checkpoint is read restricted to plain data (trust.py):
one that names anything else is refused. Retention deletes by integer step, only steps older
than the one just saved.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from . import trust
from .runtime import Runtime

STEP_DIR = re.compile(r"step_(\d{8,})")  # step_%08d; longer past 10^8 steps
PREFIX = "ufp4"  # keys of the plugin's own entries in the checkpoint
KILL_HOOK = "UFP4_TEST_CHECKPOINT_KILL_AT"  # tests only: "<phase>:<step>", see _test_hook
_MAX_METADATA_JSON = 1 << 20  # Megatron's metadata.json is ~60 bytes


class CheckpointError(RuntimeError):
    """A checkpoint dir that cannot be resumed as asked; the message says what to change."""


class Tampered(CheckpointError):
    """A pickle in a checkpoint names a Python object no checkpoint holds (a planted file):
    the start is refused, not resumed from an older step."""


class RunFailed(RuntimeError):
    """The run stopped after it started (a non-finite loss, a save that could not be
    written); the message says what was found and what is kept."""


def step_dir(ckpt_dir: Path, step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step:08d}"


def steps_on_disk(ckpt_dir: Path) -> list[int]:
    """Steps of the completed (renamed) step dirs, intact or not, ascending; a symbolic link
    named like one is listed too (and found damaged)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    return sorted(
        int(m.group(1))
        for p in d.iterdir()
        if (p.is_dir() or p.is_symlink()) and (m := STEP_DIR.fullmatch(p.name))
    )


def read_latest(ckpt_dir: Path) -> tuple[int | None, str | None]:
    """(the step `latest` names, or None; a note when it exists but names none). Only its
    first bytes are read: it is a hint, the step dirs decide."""
    marker = Path(ckpt_dir) / "latest"
    if not marker.exists() and not marker.is_symlink():
        return None, None
    if marker.is_symlink() or not marker.is_file():
        return None, f"{marker} is not a regular file: ignored"
    with open(marker, "rb") as f:
        raw = f.read(33)
    text = raw.decode("ascii", "replace").strip()
    if not text.isdigit() or len(raw) > 32:
        shown = text[:24] + ("..." if len(raw) > 24 else "")
        return None, f"{marker} holds {shown!r}, not a step number: ignored"
    return int(text), None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _tampered(path: Path, name: str) -> Tampered:
    return Tampered(
        f"{path} holds a pickle that names {name}, which no checkpoint holds (a planted or "
        "foreign file; unpickling it could run code): refused before anything of it ran. "
        "Inspect that step dir and remove it; the trainer resumes from the step before once it "
        "is gone"
    )


def inspect(path: Path) -> tuple[str | None, dict | None]:
    """(why `path` is not a complete checkpoint or None, its common state when readable).
    Metadata and common state only (no tensor data; checksums are load()'s), the same answer
    on every rank, so all ranks fall back together. Pickles are read restricted
    (train/trust.py): one that names anything else raises Tampered."""
    from torch.distributed.checkpoint.api import CheckpointException

    path = Path(path)
    if path.is_symlink():
        return f"it is a symbolic link (to {os.readlink(path)}); a step dir is never one", None
    with trust.restricted() as scope:
        try:
            why, common = _inspect(path)
        except (Exception, CheckpointException) as e:  # DCP's is a BaseException
            why, common = f"unreadable ({_one_line(e)})", None
        if scope.refused:
            raise _tampered(path, scope.refused)
    return why, common


def _inspect(path: Path) -> tuple[str | None, dict | None]:
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict
    from torch.distributed.checkpoint import FileSystemReader

    config = path / "metadata.json"
    if not config.is_file():
        return "no metadata.json (not a dist_checkpointing checkpoint)", None
    if config.stat().st_size > _MAX_METADATA_JSON:
        return f"metadata.json is {config.stat().st_size} bytes, not Megatron's config", None
    try:
        backend = json.loads(config.read_bytes()).get("sharded_backend")
    except (ValueError, AttributeError, UnicodeDecodeError) as e:
        return f"metadata.json is not Megatron's JSON config ({_one_line(e)})", None
    if backend != "torch_dist":
        return f"metadata.json names backend {backend!r}, not torch_dist", None
    try:
        manifest = trust.read(path)
    except ValueError as e:
        return str(e), None
    if manifest is not None and (problem := trust.listing_problem(path, manifest)):
        return problem, None
    try:
        meta = FileSystemReader(str(path)).read_metadata()
    except Exception as e:
        # global too, which inspect() then turns into Tampered)
        return f".metadata unreadable ({_one_line(e)})", None
    need: dict[str, int] = {}
    for info in (getattr(meta, "storage_data", None) or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        f = path / str(name)
        if "/" in str(name) or not f.is_file():
            return f"{name} is missing", None
        if f.stat().st_size < size:
            return f"{name} is truncated ({f.stat().st_size} of {size} bytes)", None
    common = load_common_state_dict(str(path))
    if not isinstance(common, dict) or f"{PREFIX}.step" not in common:
        return "no step in its common state (not written by ufp4-megatron)", None
    return None, common


def damage(path: Path) -> str | None:
    """Why `path` is not a complete checkpoint, or None when it is (see inspect)."""
    return inspect(path)[0]


@dataclass
class Found:
    step: int | None  # the newest intact step, None when there is none
    skipped: list[str]  # one line per newer step dir (or note) passed over, and why
    common: dict | None  # the common state of `step`


def find(ckpt_dir: Path) -> Found:
    """The newest intact step (metadata checks only; load() also checks the checksums)."""
    ckpt_dir = Path(ckpt_dir)
    named, note = read_latest(ckpt_dir)
    skipped = [note] if note else []
    steps = steps_on_disk(ckpt_dir)
    if named is not None and named not in steps:
        skipped.append(
            f"{ckpt_dir / 'latest'} names step {named}, whose dir "
            f"{step_dir(ckpt_dir, named)} is missing"
        )
    for step in reversed(steps):
        why, common = inspect(step_dir(ckpt_dir, step))
        if why is None:
            return Found(step, skipped, common)
        skipped.append(f"{step_dir(ckpt_dir, step)} is damaged: {why}")
    return Found(None, skipped, None)


def scan(ckpt_dir: Path) -> tuple[int | None, list[str]]:
    """(newest intact step or None, one line per newer step that was skipped and why)."""
    found = find(ckpt_dir)
    return found.step, found.skipped


def latest_step(ckpt_dir: Path) -> int | None:
    """The newest intact checkpoint's step in ckpt_dir, or None when there is none."""
    return find(ckpt_dir).step


def check_start(ckpt_dir: Path, resume: bool) -> Found:
    """Refuses a start that would mix two runs in one checkpoint dir or lose work: run it
    before anything is written (no process group needed). Returns what find() found."""
    ckpt_dir = Path(ckpt_dir)
    steps = steps_on_disk(ckpt_dir)
    named, _ = read_latest(ckpt_dir)
    if not steps and named is not None:
        raise CheckpointError(
            f"{ckpt_dir / 'latest'} names step {named} but {ckpt_dir} holds no step dir: its "
            "checkpoints were removed, so this run cannot resume. Restore them to resume; to "
            f"start the run over from step 0, remove {ckpt_dir / 'latest'} (its metrics.jsonl "
            "records are then kept aside in metrics.jsonl.superseded)"
        )
    if not steps:
        return Found(None, [], None)
    listed = ", ".join(map(str, steps))
    if not resume:
        raise CheckpointError(
            f"checkpoint.resume=false but {ckpt_dir} holds checkpoints of an earlier run (steps "
            f"{listed}); starting over there would overwrite them and cut its metrics.jsonl. "
            "Start a fresh run in a new run dir (hydra.run.dir=... or another experiment=/seed), "
            "or delete that checkpoint dir; drop checkpoint.resume=false to continue the run"
        )
    found = find(ckpt_dir)
    if found.step is None:
        raise CheckpointError(
            f"no intact checkpoint in {ckpt_dir} to resume: "
            + "; ".join(found.skipped)
            + ". Move the damaged step dirs aside to start over there"
        )
    return found


# -- whose checkpoint ------------------------------------------------------------------------


def owner(cfg, run_dir: Path) -> dict:
    """What every checkpoint records about the run that wrote it (train/rundir/identity.py)."""
    from .rundir import identity

    return {
        "run_id": identity.run_id(cfg),
        "run_dir": str(Path(run_dir).resolve()),
        "identity": identity.identity(cfg),
    }


def check_owner(common: dict | None, run: dict, ckpt_dir: Path, run_dir: Path) -> None:
    """Refuses a checkpoint written by another run: another identity (a sibling's dir given
    as checkpoint.dir), or the same config trained in another run dir that still exists.
    Checkpoints saved before they carried their run pass (config.yaml is checked instead)."""
    from .rundir import identity

    saved = (common or {}).get(f"{PREFIX}.run")
    if not isinstance(saved, dict):
        return
    ckpt_dir, run_dir = Path(ckpt_dir), Path(run_dir)
    fix = (
        "Give this run its own checkpoint.dir, or drop checkpoint.dir (the default is "
        "<run dir>/checkpoints)"
    )
    if saved.get("run_id") != run["run_id"]:
        differ = identity.differences(saved.get("identity") or {}, run["identity"])
        raise CheckpointError(
            f"{ckpt_dir} holds the checkpoints of another run: run {saved.get('run_id')} "
            f"(trained in {saved.get('run_dir')}), while this is run {run['run_id']} "
            f"({run_dir}); they differ in {', '.join(differ) or 'their identity'}. "
            "Resuming would train this run on that run's weights and prune its steps. " + fix
        )
    theirs = Path(str(saved.get("run_dir", "")))
    inside = ckpt_dir.resolve().is_relative_to(run_dir.resolve())
    if (
        not inside
        and theirs != run_dir.resolve()
        and theirs.is_absolute()
        and (theirs / "config.yaml").is_file()
    ):
        raise CheckpointError(
            f"{ckpt_dir} holds the checkpoints of the run in {theirs}, not of this run dir "
            f"{run_dir} (the same config, trained there). Resume that run in its own dir "
            f"(hydra.run.dir={theirs}), or " + fix[0].lower() + fix[1:]
        )


# -- layout ----------------------------------------------------------------------------------


def layout(runtime: Runtime) -> dict:
    """This run's parallel layout and optimizer-state format, as stored in a checkpoint."""
    from megatron.core import parallel_state as ps

    return {
        "tp": ps.get_tensor_model_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "ep": ps.get_expert_model_parallel_world_size(),
        "dp": ps.get_data_parallel_world_size(),
        "world_size": dist.get_world_size(),
        "distributed_optimizer": runtime.distributed_optimizer,
        "optim_sharding": runtime.optim_sharding,
    }


def check_layout(saved: dict, now: dict, path: Path) -> None:
    """Refuses what Megatron's checkpoint formats cannot reshard, naming the fix.

    Model weights and a non-distributed optimizer are stored in model space (global tensor
    shapes): TP and DP may change. The distributed optimizer in `fully_reshardable` form is
    model space too. In `dp_reshardable` form (Megatron-LM's default) its state is the flat
    bucket layout of one TP x PP partition: only DP may change. PP never changes here: the
    SR-seed streams are per pipeline stage, so a new PP layout cannot continue them. EP never
    changes: Megatron's (chained) optimizer state for expert parameters has another structure
    at another EP size (seen: EP=2 -> 1 fails in _filter_and_reorder_param_groups)."""

    def refuse(what: str, fix: str) -> None:
        raise CheckpointError(
            f"{path} was saved with {_describe(saved)}; this run has "
            f"{_describe(now)}: {what}. {fix}"
        )

    back = (
        f"Resume with parallel.tp={saved['tp']} parallel.pp={saved['pp']} "
        f"parallel.ep={saved['ep']} parallel.distributed_optimizer="
        f"{str(saved['distributed_optimizer']).lower()}"
    )
    if saved["pp"] != now["pp"]:
        refuse(
            "changing parallel.pp on resume is not supported (the SR-seed streams are per "
            "pipeline stage)",
            back,
        )
    if saved["ep"] != now["ep"]:
        refuse(
            "changing parallel.ep on resume is not supported (Megatron's optimizer state "
            "for the expert parameters is structured per EP size)",
            back,
        )
    if saved["distributed_optimizer"] != now["distributed_optimizer"]:
        refuse(
            "switching the distributed optimizer on or off on resume is not supported (its "
            "state dict differs from Megatron's plain optimizer's)",
            back,
        )
    if saved["optim_sharding"] == "dp_reshardable" and saved["tp"] != now["tp"]:
        refuse(
            "the distributed optimizer's dp_reshardable state can change only the "
            "data-parallel size",
            back + ", or save the run with "
            "checkpoint.optim_fully_reshardable=true to change TP later",
        )


def _describe(lay: dict) -> str:
    opt = (
        f"distributed optimizer ({lay['optim_sharding']})"
        if lay["distributed_optimizer"]
        else "Megatron's non-distributed optimizer"
    )
    return (
        f"tp={lay['tp']} pp={lay['pp']} ep={lay['ep']} dp={lay['dp']} "
        f"({lay['world_size']} rank{'s' * (lay['world_size'] != 1)}), {opt}"
    )


# -- state -----------------------------------------------------------------------------------


def _sharded_metadata(runtime: Runtime) -> dict:
    """What Megatron-LM's _build_sharded_state_dict_metadata passes to sharded_state_dict."""
    from megatron.core import parallel_state as ps

    md = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if runtime.distributed_optimizer:
        md["distrib_optim_sharding_type"] = runtime.optim_sharding
        if runtime.optim_sharding == "fully_reshardable":
            md["distrib_optim_fully_reshardable_mem_efficient"] = False
    md["dp_cp_group"] = ps.get_data_parallel_group(with_context_parallel=True)
    return md


def _rng_state(runtime: Runtime) -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "random": random.getstate(),
        "tracker": get_cuda_rng_tracker().get_states(),
    }
    if runtime.saves_cuda_rng:
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])
    get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def _sharded_state(
    model, optimizer, extra: dict, md: dict, runtime: Runtime, *, loading: bool, rng: bool
) -> dict:
    """The state dict handed to dist_checkpointing (a template when loading).

    `extra` objects (SR seeds, LR scheduler) are equal on every rank of a pipeline stage: one
    ShardedObject per stage, the other ranks replicas. RNG states are per rank, keyed by
    (pp, tp, dp) as Megatron-LM keys them by (pp, tp)."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    pp, pp_rank = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    tp_rank, dp_rank = ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()
    model_sd = model.sharded_state_dict(metadata=md)
    state = {
        "model": model_sd,
        "optimizer": optimizer.opt.sharded_state_dict(model_sd, is_loading=loading, metadata=md),
    }
    for name, obj in extra.items():
        state[f"{PREFIX}.{name}"] = ShardedObject(
            f"{PREFIX}.{name}",
            None if loading else obj.state_dict(),
            (pp,),
            (pp_rank,),
            replica_id=(tp_rank, dp_rank),
        )
    if rng:
        tp, dp = ps.get_tensor_model_parallel_world_size(), ps.get_data_parallel_world_size()
        state[f"{PREFIX}.rng"] = ShardedObject(
            f"{PREFIX}.rng",
            None if loading else _rng_state(runtime),
            (pp, tp, dp),
            (pp_rank, tp_rank, dp_rank),
            replica_id=0,
        )
    return state


# -- save ------------------------------------------------------------------------------------


def save(
    ckpt_dir: Path,
    step: int,
    model,
    optimizer,
    extra: dict,
    keep: int,
    *,
    runtime: Runtime,
    run: dict | None = None,
    checksummed: bool = True,
) -> Path:
    """Collective: every rank writes its shards into step_N.saving; rank 0 then renames it,
    points `latest` at it and prunes older steps beyond `keep` (keep <= 0: keep all).
    `run`: owner() of the run, stored in the common state. A save the filesystem refuses
    (full, read-only) raises RunFailed with the OS's reason; the step dirs already there are
    untouched (nothing is pruned before the new step is complete)."""
    ckpt_dir = Path(ckpt_dir)
    final = step_dir(ckpt_dir, step)
    tmp = final.with_name(final.name + ".saving")
    rank0 = dist.get_rank() == 0
    try:
        if rank0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            _remove(tmp)  # a save that was killed (or a planted link: removed, not followed)
            tmp.mkdir()
        dist.barrier()
        _write_step(
            tmp,
            final,
            ckpt_dir,
            step,
            model,
            optimizer,
            extra,
            keep,
            runtime,
            run,
            checksummed,
            rank0,
        )
    except (Exception, _dcp_exception()) as e:
        reason = os_reason(e) or _filesystem_problem(tmp if tmp.exists() else ckpt_dir)
        if reason is None:
            raise
        if rank0:
            _remove(tmp, quiet=True)  # free what it took
        steps = steps_on_disk(ckpt_dir)
        kept = (
            f"the newest complete checkpoint, {step_dir(ckpt_dir, steps[-1])}, is kept as it was"
            if steps
            else "no earlier checkpoint exists"
        )
        raise RunFailed(
            f"saving step {step} to {ckpt_dir} failed: {reason}; {kept}. Fix that "
            "(free space, a writable checkpoint.dir) and rerun to resume"
        ) from None
    dist.barrier()
    return final


def _write_step(
    tmp, final, ckpt_dir, step, model, optimizer, extra, keep, runtime, run, checksummed, rank0
) -> None:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    _test_hook("tmp_created", step)
    md = _sharded_metadata(runtime)
    state = _sharded_state(model, optimizer, extra, md, runtime, loading=False, rng=True)
    state[f"{PREFIX}.step"] = step
    state[f"{PREFIX}.layout"] = layout(runtime)
    if run is not None:
        state[f"{PREFIX}.run"] = run
    dist_checkpointing.save(  # ends in a barrier
        state,
        str(tmp),
        get_default_save_sharded_strategy(runtime.checkpoint_format),
        content_metadata=_plain(md),
    )
    if checksummed:
        _write_manifest(tmp)
    _test_hook("shards_written", step)
    if rank0:
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
        if final.exists() or final.is_symlink():  # a damaged dir of this step, or one left
            _discard(final)  # by a fallback resume
        os.replace(tmp, final)
        _fsync(ckpt_dir)
        _test_hook("renamed", step)
        write_atomic(ckpt_dir / "latest", str(step))
        _test_hook("latest_written", step)
        prune(ckpt_dir, step, keep)


def _write_manifest(tmp: Path) -> None:
    """Collective: each rank hashes its own share of the files (trust.share), rank 0
    writes the manifest; it is the last file of the step dir."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = trust.hash_share(tmp, rank, world)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank == 0:
        digests = {k: v for part in gathered for k, v in part.items()}
        missing = set(trust.checkpoint_files(tmp)) - set(digests)
        digests |= {n: trust.file_sha256(tmp / n) for n in missing}
        write_atomic(tmp / trust.MANIFEST, trust.manifest_text(digests), sync_dir=False)
    dist.barrier()


def _dcp_exception():
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


_DISK_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EIO,
    errno.EFBIG,
}


def os_reason(e: BaseException) -> str | None:
    """The OS error behind a failed save, said as the OS says it ("No space left on device"),
    or None when it was something else. Megatron's writer threads report theirs inside a
    CheckpointException's failures or as text, so all of those are searched."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in _DISK_ERRNOS:
            return f"{x.strerror} ({errno.errorcode.get(x.errno, x.errno)})"
        todo += [x.__cause__, x.__context__]
        for failure in (getattr(x, "failures", None) or {}).values():
            todo.append(failure[0] if isinstance(failure, tuple) else failure)
    m = re.search(r"\[Errno (\d+)\] ([^:'\"\n]+)", str(e))
    if m and int(m.group(1)) in _DISK_ERRNOS:
        return f"{m.group(2).strip()} ({errno.errorcode.get(int(m.group(1)), m.group(1))})"
    return None


_NEARLY_FULL = 16 << 20  # bytes


def _filesystem_problem(path: Path) -> str | None:
    """Why the filesystem under `path` cannot take a save, asked after one failed: torch's
    writer reports a full disk as "unexpected pos 704 vs 598" (its stream writer drops the
    OS error), so the disk is asked directly: read-only, (nearly) full, or refusing a write."""
    try:
        st = os.statvfs(path)
    except OSError as e:
        return f"{e.strerror} ({errno.errorcode.get(e.errno, e.errno)})"
    if st.f_flag & os.ST_RDONLY:
        return "Read-only file system (EROFS)"
    free = st.f_bavail * st.f_frsize
    if free < min(_NEARLY_FULL, st.f_blocks * st.f_frsize // 100 + 1):
        return f"No space left on device (ENOSPC: {free} bytes free when the save failed)"
    try:
        with tempfile.TemporaryFile(dir=path) as f:
            f.write(b"\0" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return f"{e.strerror} ({errno.errorcode.get(e.errno, e.errno)})"
    return None


def prune(ckpt_dir: Path, step: int, keep: int) -> list[int]:
    """Deletes step dirs older than the `keep` newest at or below `step`; never a newer one.
    Each is renamed first, so a kill mid-delete leaves no half-deleted step dir."""
    if keep <= 0:
        return []
    older = [s for s in steps_on_disk(ckpt_dir) if s <= step][:-keep]
    for s in older:
        _discard(step_dir(ckpt_dir, s), phase=("pruning", step))
    for p in Path(ckpt_dir).glob("*.deleting"):  # left by a kill mid-delete
        _remove(p, quiet=True)
    return older


def _remove(path: Path, quiet: bool = False) -> None:
    """Removes a dir tree, or a file or symbolic link in its place (never what a link names)."""
    try:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
    except OSError:
        if not quiet:
            raise


def _discard(path: Path, phase: tuple[str, int] | None = None) -> None:
    gone = path.with_name(path.name + ".deleting")
    _remove(gone, quiet=True)
    os.replace(path, gone)
    if phase is not None:
        _test_hook(*phase)
    _remove(gone, quiet=True)


def _plain(md: dict) -> dict:
    return {k: v for k, v in md.items() if k != "dp_cp_group"}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str, sync_dir: bool = True) -> None:
    """Writes `path` through a fresh temp file beside it (O_EXCL: a link planted at any name
    is never followed), fsynced, then renamed over it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide it from the group
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        _fsync(path.parent)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _test_hook(phase: str, step: int) -> None:
    """Tests kill the process at a named point of a save (SIGKILL: no cleanup runs), e.g.
    UFP4_TEST_CHECKPOINT_KILL_AT=renamed:4. Unset in real runs."""
    if os.environ.get(KILL_HOOK) == f"{phase}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


# -- load ------------------------------------------------------------------------------------


def _choose(ckpt_dir: Path, verify: bool) -> Found:
    """Collective find(): every rank inspects the same step dirs, newest first; the ranks
    must agree on what they see (a filesystem that shows nodes different files would
    otherwise load different steps on different ranks), and the first intact step's
    checksums are verified by all ranks together, each reading its share."""
    ckpt_dir = Path(ckpt_dir)
    rank, world = dist.get_rank(), dist.get_world_size()
    named, note = read_latest(ckpt_dir)
    skipped = [note] if note else []
    steps = steps_on_disk(ckpt_dir)
    agree("the step dirs of " + str(ckpt_dir), steps)
    if named is not None and named not in steps:
        skipped.append(
            f"{ckpt_dir / 'latest'} names step {named}, whose dir "
            f"{step_dir(ckpt_dir, named)} is missing"
        )
    for step in reversed(steps):
        path = step_dir(ckpt_dir, step)
        tampered = None
        try:
            why, common = inspect(path)
        except Tampered as e:  # said once every rank agrees (one rank alone would hang)
            why, common, tampered = str(e), None, e
        agree(f"whether {path} is intact", why)
        if tampered is not None:
            raise tampered
        if why is None and verify:
            manifest = trust.read(path)  # inspect() checked that it parses
            if manifest is not None:
                mine = trust.verify_share(path, manifest, rank, world)
                found = [None] * world
                dist.all_gather_object(found, mine)
                why = next((w for w in found if w is not None), None)
        if why is None:
            return Found(step, skipped, common)
        skipped.append(f"{path} is damaged: {why}")
    return Found(None, skipped, None)


def agree(what: str, mine) -> None:
    """Raises CheckpointError unless every rank passes an equal `mine` (collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    views = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    problem = disagreement(what, views)
    if problem:
        raise CheckpointError(problem)


def disagreement(what: str, views: list) -> str | None:
    """One line naming the ranks that see something else than rank 0, or None."""
    odd = [r for r, v in enumerate(views) if v != views[0]]
    if not odd:
        return None
    return (
        f"the ranks disagree on {what}: rank 0 sees {views[0]!r}, rank {odd[0]} sees "
        f"{views[odd[0]]!r}; every rank must see the same files (a shared filesystem "
        "that is not coherent across nodes, or ranks started with different paths)"
    )


def load(
    ckpt_dir: Path,
    model,
    optimizer,
    extra: dict,
    *,
    runtime: Runtime,
    run: dict | None = None,
    run_dir: Path | None = None,
    verify: bool = True,
) -> int:
    """Restores the newest intact checkpoint in ckpt_dir (collective); returns its step.
    `run`/`run_dir`: owner() of the loading run and its dir, checked against the
    checkpoint's (check_owner). Every pickle is read restricted (train/trust.py)."""
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException

    ckpt_dir = Path(ckpt_dir)
    found = _choose(ckpt_dir, verify)
    if found.step is None:
        raise CheckpointError(f"no intact checkpoint in {ckpt_dir}: " + "; ".join(found.skipped))
    path = step_dir(ckpt_dir, found.step)
    if run is not None:
        check_owner(found.common, run, ckpt_dir, run_dir or Path(run["run_dir"]))
    if found.skipped and dist.get_rank() == 0:
        print(
            f"WARNING: {'; '.join(found.skipped)}. Resuming from {path} instead",
            file=sys.stderr,
            flush=True,
        )
    common = found.common
    saved, now = common[f"{PREFIX}.layout"], layout(runtime)
    check_layout(saved, now, path)
    md = dict(dist_checkpointing.load_content_metadata(preloaded_state_dict=common) or {})
    md |= {k: v for k, v in _sharded_metadata(runtime).items() if k == "dp_cp_group"}
    same_ranks = all(saved[k] == now[k] for k in ("tp", "pp", "ep", "dp"))
    optimizer.prepare_load()
    template = _sharded_state(model, optimizer, extra, md, runtime, loading=True, rng=same_ranks)
    check_shapes(template, path)
    with trust.restricted() as scope:
        try:
            state = dist_checkpointing.load(template, str(path))
            with torch.no_grad():
                model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            for name, obj in extra.items():
                obj.load_state_dict(state[f"{PREFIX}.{name}"])
        except (Exception, CheckpointException) as e:  # passed the metadata checks but
            if scope.refused:  # cannot be read
                raise _tampered(path, scope.refused) from None
            raise CheckpointError(
                f"cannot load {path}: {_one_line(e)}. Move it aside to resume from the step before"
            ) from None
    if same_ranks:
        _set_rng_state(state[f"{PREFIX}.rng"])
    elif dist.get_rank() == 0:
        print(
            f"resharding {path}: {_describe(saved)} -> {_describe(now)}; RNG states not "
            "restored (per rank)",
            flush=True,
        )
    return int(state[f"{PREFIX}.step"])


def check_shapes(template: dict, path: Path) -> None:
    """Refuses a checkpoint whose model tensors have other shapes than this run's model (a
    checkpoint of another model: say which tensor, instead of dist_checkpointing's trace)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from torch.distributed.checkpoint import FileSystemReader

    with trust.restricted():
        stored = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    for sh in nested_values(template.get("model", {})):
        if not isinstance(sh, ShardedTensor) or sh.key not in stored:
            continue
        have, want = tuple(getattr(stored[sh.key], "size", ()) or ()), tuple(sh.global_shape)
        # Megatron pads the vocab dim of these itself (padded vocab sizes may differ)
        cut = 1 if getattr(sh, "allow_shape_mismatch", False) else 0
        if have and have[cut:] != want[cut:]:
            raise CheckpointError(
                f"{path} holds another model: its {sh.key} is {list(have)}, this run's "
                f"{list(want)}. Resume it with the model it was trained with "
                "(the model.* settings of its run), or start this model in a new checkpoint.dir"
            )


# SIGINT too: Ctrl-C saves and stops like a pre-emption warning (exit status 130)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def start_checkpoint_writer_queue() -> None:
    """Starts dist_checkpointing's result queue now, deaf to the stop signals.

    Megatron's checkpoint writer reports through a multiprocessing Manager, a child process
    it spawns at the first save. Slurm's pre-emption SIGTERM (and torchrun's) reaches every
    process of the job step, and a terminal's Ctrl-C every process of its foreground group,
    so a Manager started with the default disposition dies at the moment the trainer writes
    its stopping checkpoint, and that save fails (BrokenPipeError; seen under Slurm). Ignored
    dispositions survive the spawn's exec, so SIGTERM and SIGUSR1 are ignored while it starts
    and the Manager lives until the trainer ends it (or dies: train/lifetime.py). SIGINT is
    blocked instead (the Manager ignores SIGINT itself): a Ctrl-C during a slow start-up stays
    pending and stops the trainer when the start-up ends, where an ignored one was dropped.
    """
    import multiprocessing

    from megatron.core.dist_checkpointing.strategies.filesystem_async import (
        get_write_results_queue,
    )

    from .lifetime import reap_with_me

    before = {p.pid for p in multiprocessing.active_children()}
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGUSR1)}
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        get_write_results_queue()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    reap_with_me([p.pid for p in multiprocessing.active_children() if p.pid not in before])


class StopSignal:
    """Turns SIGTERM/SIGUSR1 (Slurm's pre-emption warnings) and SIGINT (Ctrl-C) into a flag
    read between steps; `requested()` agrees across ranks, so all of them save and stop at
    the same step. A second SIGINT ends the process at once (exit status 130): a save in
    progress is abandoned in its step_N.saving dir, which is never read, so the last
    complete checkpoint stays the one a rerun resumes from.

    The loop sets `steps_done` after each step; the first signal records it, so the stop
    message can say when the signal came, and a reader (or test) can check that the trainer
    saved at most one step after it: the flag is read after every step.
    """

    def __init__(self, runtime: Runtime):
        self._flag = False
        self._device = runtime.collective_device  # where the process group reduces the flag
        self.steps_done = 0
        self.arrival: tuple[str, int] | None = None  # (signal name, steps done when it came)
        start_checkpoint_writer_queue()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        say = os.environ.get("LOCAL_RANK", "0") == "0"  # once per node
        if signum == signal.SIGINT and self.arrival is not None and self.arrival[0] == "SIGINT":
            if say:
                os.write(
                    2,
                    b"second Ctrl-C: stopped at once, without saving; a rerun "
                    b"resumes from the last complete checkpoint\n",
                )
            os._exit(130)
        if self.arrival is None:
            self.arrival = (signal.Signals(signum).name, self.steps_done)
            if signum == signal.SIGINT and say:
                os.write(
                    2,
                    b"Ctrl-C: saving a checkpoint after this step, then stopping "
                    b"(Ctrl-C again stops at once, without saving)\n",
                )
        self._flag = True

    @property
    def exit_status(self) -> int:
        """130 after Ctrl-C (as a shell reports a SIGINT), 0 after a pre-emption warning."""
        return 130 if self.arrival is not None and self.arrival[0] == "SIGINT" else 0

    def describe(self) -> str:
        """'SIGTERM after step 6' on a rank that got it; on one that did not (the all-reduce
        told it), 'a stop signal on another rank'."""
        if self.arrival is None:
            return "a stop signal on another rank"
        name, done = self.arrival
        return f"{name} after step {done}"

    def requested(self) -> bool:
        t = torch.tensor([int(self._flag)], dtype=torch.int32)
        if dist.is_initialized():
            t = t.to(self._device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())
