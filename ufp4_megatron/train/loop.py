"""The training loop: straight-line, one global batch per step.

decide the runtime (train/runtime.py) -> inside its scope: set up ranks -> recipe ->
model -> optimizer -> data (train/build.py) -> resume? -> for step: fwd/bwd (Megatron's
get_forward_backward_func), optimizer step, log, maybe checkpoint / stop.
"""

from __future__ import annotations

import math
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..quant import weight_cache
from . import checkpoint, determinism, distributed, optim, schedule
from . import runtime as runtime_lib
from .build import build_run
from .live_gap import LiveGap
from .logs import log_line, wandb_run
from .logs.metrics import MetricsFile
from .precision import check_bf16_layers
from .probes import LayerProbes
from .rundir import resume_check
from .schema import Config


def _mean_loss(reports: list[dict], rt: runtime_lib.Runtime) -> float:
    """Token-weighted mean loss over this step's micro-batches and data-parallel ranks."""
    from megatron.core import parallel_state as ps

    if not reports:  # not the last pipeline stage
        t = torch.zeros(2)
    else:
        t = torch.stack([r["lm loss"] for r in reports]).sum(0).float().cpu()
    if dist.get_world_size() > 1:
        t = t.to(rt.collective_device)
        dist.all_reduce(t)  # sums over all ranks; TP peers repeat the same value
        t = t.cpu() / ps.get_tensor_model_parallel_world_size()
    return float(t[0] / t[1])


def train(cfg: Config, run_dir: Path) -> list[dict]:
    ckpt_dir = resume_check.checkpoint_dir(cfg, run_dir)
    found = checkpoint.check_start(ckpt_dir, cfg.checkpoint.resume)  # before anything is written
    checkpoint.check_owner(found.common, checkpoint.owner(cfg, run_dir), ckpt_dir, run_dir)
    optim.check_schedule(cfg)
    rt = runtime_lib.decide(cfg)
    # train.deterministic before anything touches cuBLAS, NCCL or TE; on CPU the CUDA shims;
    # both for the whole run and undone after it
    with determinism.scope(cfg), rt.scope():
        return _train(cfg, run_dir, ckpt_dir, rt)


def _train(cfg: Config, run_dir: Path, ckpt_dir: Path, rt: runtime_lib.Runtime) -> list[dict]:
    t_start = time.perf_counter()
    check_bf16_layers(cfg.precision, cfg.model.num_layers)
    t = cfg.train
    n_evals = t.steps // t.eval_interval + 1 if t.eval_interval else 0
    run = checkpoint.owner(cfg, run_dir)

    def agree_on_the_run():  # refused before a model or dataset is built
        # every rank must write the same run: one that resolved another dir (a relative path
        # under another working directory) would resume or save elsewhere
        checkpoint.agree(
            "the run dir and checkpoint dir",
            (run["run_dir"], str(Path(ckpt_dir).resolve()), run["run_id"]),
        )

    built = build_run(
        cfg,
        rt,
        n_train=t.steps * t.global_batch,
        n_valid=max(1, n_evals * t.eval_iters * t.global_batch),
        after_init=agree_on_the_run,
    )
    env, recipe, model, policy, opt = built.env, built.recipe, built.model, built.policy, built.opt
    valid_ds, n_micro = built.valid_ds, built.n_micro
    train_model = opt.model  # Megatron's DDP wrapper
    train_step = schedule.TrainingStep(built, cfg, rt)  # before a checkpoint loads
    extra = {"policy": policy, "lr_schedule": opt.scheduler}  # SR-seed stream, LR state

    start = 0
    if cfg.checkpoint.resume and checkpoint.latest_step(ckpt_dir) is not None:
        start = checkpoint.load(
            ckpt_dir,
            model,
            opt,
            extra,
            runtime=rt,
            run=run,
            run_dir=run_dir,
            verify=cfg.checkpoint.checksums,
        )
        weight_cache.invalidate()  # loaded weights: kept operands of the built ones are stale
    is_main = env.rank == 0
    if is_main:
        print(rt.describe(), flush=True)
        if cfg.train.deterministic:
            print(determinism.describe(), flush=True)
        print(
            log_line.params_line(
                cfg.model, sum(p.numel() for p in model.parameters()), env.world_size
            ),
            flush=True,
        )
    if is_main and start and (note := optim.resumed_schedule_note(opt.scheduler, cfg)):
        print(note, flush=True)
    metrics = MetricsFile(run_dir / "metrics.jsonl", start) if is_main else None
    wb = wandb_run.start(cfg, run_dir) if is_main else None
    live = LiveGap(cfg, run_dir, wb) if wb is not None else None  # gap_vs_bf16, ...
    progress = (
        log_line.Progress(cfg.logging.progress, t.steps, start, cfg.logging.print_interval)
        if is_main
        else None
    )
    tboard = None
    if is_main and cfg.logging.tensorboard:
        from .logs.tensorboard_log import TensorBoard

        tboard = TensorBoard(run_dir)
    flops_token = log_line.flops_per_token(cfg.model, t.seq_len)
    peak = log_line.peak_tflops(
        torch.cuda.get_device_name() if rt.on_gpu else None, cfg.logging.peak_tflops
    )
    probes = None
    if is_main and cfg.logging.wandb.diagnostics_interval and recipe.quantized:
        probes = LayerProbes(model, list(cfg.logging.wandb.diagnostics_layers), recipe)
    stop = checkpoint.StopSignal(rt)
    stop.steps_done = start
    tokens_per_step = t.global_batch * t.seq_len
    records = []

    step, stopping = start, False
    while step < t.steps:
        t0 = time.perf_counter()
        lr = opt.advance_lr()
        # this iteration trains step + 1: diagnostics land on multiples of the interval
        diag_step = probes is not None and (step + 1) % cfg.logging.wandb.diagnostics_interval == 0
        if probes is not None:
            probes.active = diag_step
        reports, grad_norm = train_step(step)
        loss = _mean_loss(reports, rt)
        step += 1
        _stop_if_not_finite(step, {"loss": loss, "grad_norm": grad_norm}, ckpt_dir)
        stop.steps_done = step
        record = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": step * tokens_per_step,
            "step_time": time.perf_counter() - t0,
        }
        record["tokens_per_s"] = tokens_per_step / record["step_time"]
        record |= log_line.throughput(
            tokens=tokens_per_step,
            seconds=record["step_time"],
            flops_token=flops_token,
            world_size=env.world_size,
            peak=peak,
        )
        if t.eval_interval and (step % t.eval_interval == 0 or step == t.steps):
            record["val_loss"] = _validate(cfg, train_model, valid_ds, env, rt, n_micro)
            _stop_if_not_finite(step, {"val_loss": record["val_loss"]}, ckpt_dir)
        if rt.on_gpu:
            record["mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
            if step == start + 1 and is_main and rt.weight_cache != "none":
                print(
                    f"weight cache: {weight_cache.kept_bytes(model) / 2**30:.2f} GiB kept "
                    f"({rt.weight_cache})",
                    flush=True,
                )
        else:  # peak resident memory of this process (Linux reports KiB)
            record["max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        logged = step % cfg.logging.log_interval == 0 or step == t.steps
        if is_main:
            records.append(record)
            if logged:
                metrics.write(record)
            if wb is not None and (logged or diag_step):  # diagnostics whatever log_interval
                wb.log(record | (probes.stats() if diag_step else {}), step=step)
            if wb is not None and logged:
                live.log(record)
            if tboard is not None and logged:
                tboard.log(record)
            progress.update(record)
        stopping = stop.requested()
        if (
            stopping
            or (cfg.checkpoint.interval and step % cfg.checkpoint.interval == 0)
            or (step == t.steps and cfg.checkpoint.save_at_end)
        ):
            t_save = time.perf_counter()
            _stop_if_params_not_finite(step, model, rt, ckpt_dir)
            checkpoint.save(
                ckpt_dir,
                step,
                model,
                opt,
                extra,
                cfg.checkpoint.keep,
                runtime=rt,
                run=run,
                checksummed=cfg.checkpoint.checksums,
            )
            if is_main:  # a save's cost is a user's question at scale (and the step table's)
                progress.write(
                    f"checkpoint: saved step {step} in {time.perf_counter() - t_save:.1f} s"
                )
        if stopping:
            if is_main:
                progress.write(
                    f"stop signal ({stop.describe()}): saved step {step} to "
                    f"{ckpt_dir}; rerun to resume"
                )
            break

    if is_main:
        progress.close()
        metrics.close()
        if tboard is not None:
            tboard.close()
        if wb is not None:
            wb.finish()
        print(
            log_line.summary_line(
                records,
                start=start,
                total=t.steps,
                run_dir=run_dir,
                wall_s=time.perf_counter() - t_start,
                stopped=stopping,
            ),
            flush=True,
        )
    distributed.shutdown()
    if stopping and stop.exit_status:  # Ctrl-C: saved, and says so with the shell's 130
        raise SystemExit(stop.exit_status)
    return records


def _stop_if_not_finite(step: int, values: dict, ckpt_dir: Path) -> None:
    """A NaN or Inf loss or gradient norm ends the run before anything of this step is saved
    or logged: every later step would train on it, a checkpoint of it would be resumed, and
    retention would push the finite ones out. Every rank has the same values (all-reduced)."""
    bad = {k: v for k, v in values.items() if v is None or not math.isfinite(v)}
    if bad:
        raise checkpoint.RunFailed(
            f"step {step}: {', '.join(f'{k} is {v}' for k, v in bad.items())}; stopped without "
            f"saving or logging this step. {_last_checkpoint(ckpt_dir)}. Look for the cause "
            "(a learning rate or init too large, a data problem) before resuming"
        )


def _stop_if_params_not_finite(step: int, model, rt: runtime_lib.Runtime, ckpt_dir: Path) -> None:
    """The weights about to be saved are finite on every rank (an update can make them Inf
    with a finite loss and gradient norm: optim.lr=inf)."""
    flags = [torch.isfinite(p).all() for p in model.parameters()]  # one sync, not one each
    ok = (torch.stack(flags).all() if flags else torch.tensor(True)).to(torch.int32).reshape(1)
    if dist.is_initialized() and dist.get_world_size() > 1:
        ok = ok.to(rt.collective_device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if not int(ok.item()):
        raise checkpoint.RunFailed(
            f"step {step}: the model's weights hold NaN or Inf after the update; not saved. "
            f"{_last_checkpoint(ckpt_dir)}. Look for the cause (a learning rate too large?) "
            "before resuming"
        )


def _last_checkpoint(ckpt_dir: Path) -> str:
    steps = checkpoint.steps_on_disk(ckpt_dir)
    if not steps:
        return "No checkpoint was saved before it"
    return f"The last checkpoint, {checkpoint.step_dir(ckpt_dir, steps[-1])}, is kept as it was"


@torch.no_grad()
def _validate(cfg, model, valid_ds, env, rt, n_micro) -> float:
    """Mean loss over eval_iters fixed validation batches (the same batches every time)."""
    model.eval()
    losses = []
    for i in range(cfg.train.eval_iters):
        reports = schedule.forward_backward(
            model,
            schedule.micro_batches(valid_ds, i, cfg, env, rt.device),
            n_micro=n_micro,
            seq_len=cfg.train.seq_len,
            micro_batch=cfg.train.micro_batch,
            forward_only=True,
        )
        losses.append(_mean_loss(reports, rt))
    model.train()
    return sum(losses) / len(losses)
