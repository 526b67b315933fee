"""What the trainer prints: the parameter count at start, one line per logged step, a summary
at the end; and the model FLOPs behind its TFLOP/s and MFU.

The step line carries what Megatron-LM's `--log-throughput` and torchtitan print:

    step 20 of 200 | tokens 164k | loss 4.8123 | lr 3.00e-04 | grad_norm 0.812 | 61.2 ms/it |
    134k tok/s | 11.9 TFLOP/s/GPU | MFU 1.2% | mem 3.10 GiB | elapsed 0:00:01 | ETA 0:00:11

On a terminal it sits under a tqdm bar (printed through `tqdm.write`, so the bar is not
overprinted); to a file or pipe (Slurm's output) every line carries the elapsed time and ETA.

Model FLOPs per token follow PaLM's convention (Chowdhery et al. 2022, App. B): 6 N + 12 L d s,
N the parameters a token multiplies with (attention and MLP linears, the routed experts it is
sent to, shared experts, router, LM head; not the embedding lookup or norms), L layers,
d = heads x head dim, s the sequence length. MFU divides the achieved model FLOP/s per GPU by
the GPU's dense BF16 peak (a small table by device name, `logging.peak_tflops` overrides it):
the 4-bit recipes are measured against the same BF16 peak, so their MFU compares with BF16's.
On CPU, or on a GPU the table lacks with no override, MFU is left out rather than guessed.
"""

from __future__ import annotations

import sys
import time

from ..footprint import count_params
from ..schema import ModelConfig

# Dense BF16 tensor-core peak per GPU in TFLOP/s (the vendors' data sheets, no sparsity).
# Matched against torch.cuda.get_device_name() by substring, first match wins (so the PCIe
# and NVL parts of a family come before it).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("H800", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("B200", 2250.0),
    ("B100", 1750.0),
    ("GB200", 2500.0),
    ("L40S", 362.0),
    ("MI300X", 1307.0),
)


def peak_tflops(device_name: str | None, override: float | None) -> float | None:
    """The BF16 peak to divide by: the override, else the table's, else None (no MFU)."""
    if override is not None:
        return float(override)
    if device_name is None:  # CPU: no peak worth dividing by
        return None
    for key, peak in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return peak
    return None


def flops_per_token(m: ModelConfig, seq_len: int) -> float:
    """Training (forward + backward) model FLOPs per token, PaLM's count (module docstring)."""
    c = count_params(m)
    h = m.hidden_size
    d = m.kv_channels or h // m.num_attention_heads
    lookup = m.vocab_size * h if m.untie_embeddings else 0  # the input embedding is a gather
    norms = h * (2 * m.num_layers + 1)
    n_matmul = c.active - lookup - norms
    return 6 * n_matmul + 12 * m.num_layers * m.num_attention_heads * d * seq_len


def throughput(
    *, tokens: int, seconds: float, flops_token: float, world_size: int, peak: float | None
) -> dict:
    """tflops_per_gpu (and mfu where a peak is known) of one step."""
    tflops = flops_token * tokens / seconds / world_size / 1e12
    out = {"tflops_per_gpu": tflops}
    if peak:
        out["mfu"] = tflops / peak
    return out


def _si(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.0f}"


def clock(seconds: float) -> str:
    """H:MM:SS, as tqdm and Megatron print durations."""
    s = round(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def step_line(record: dict, total: int) -> str:
    """The logged step as one line (module docstring); keys a record lacks are left out."""
    parts = [
        f"step {record['step']} of {total}",
        f"tokens {_si(record['tokens'])}",
        f"loss {record['loss']:.4f}",
    ]
    if "val_loss" in record:
        parts.append(f"val_loss {record['val_loss']:.4f}")
    parts += [
        f"lr {record['lr']:.2e}",
        f"grad_norm {record['grad_norm']:.3f}",
        f"{record['step_time'] * 1e3:.1f} ms/it",
        f"{_si(record['tokens_per_s'])} tok/s",
    ]
    if "tflops_per_gpu" in record:
        parts.append(f"{record['tflops_per_gpu']:.3g} TFLOP/s/GPU")
    if "mfu" in record:
        parts.append(f"MFU {record['mfu']:.1%}")
    if "mem_gib" in record:
        parts.append(f"mem {record['mem_gib']:.2f} GiB")
    elif "max_rss_gib" in record:
        parts.append(f"rss {record['max_rss_gib']:.2f} GiB")
    return " | ".join(parts)


def params_line(m: ModelConfig, local: int, world_size: int) -> str:
    """The parameter count printed at start: the model's (config) and what this rank holds."""
    c = count_params(m)
    active = f", {c.active:,} active per token" if c.active != c.total else ""
    return (
        f"model {m.name}: {c.total:,} parameters ({c.embedding:,} embedding{active}); "
        f"rank 0 holds {local:,}" + (f" of {world_size} ranks" if world_size > 1 else "")
    )


def summary_line(
    records: list[dict], *, start: int, total: int, wall_s: float, run_dir, stopped: bool
) -> str:
    """The run's last line: how far it got, its last losses, wall time, where it is."""
    if not records:
        return f"done: no step trained in this start ({wall_s:.1f} s); run dir {run_dir}"
    last = records[-1]
    val = next((r for r in reversed(records) if "val_loss" in r), None)
    what = "stopped" if stopped else "done"
    val_text = f", val loss {val['val_loss']:.4f} (step {val['step']})" if val else ""
    return (
        f"{what}: steps {start + 1}-{last['step']} of {total} in {clock(wall_s)} (wall), "
        f"loss {last['loss']:.4f}{val_text}; run dir {run_dir}"
    )


def say(line: str) -> None:
    """A line printed while training runs: above the progress bar if one is drawn
    (tqdm.write clears and redraws it), flushed for files and pipes."""
    from tqdm import tqdm

    tqdm.write(line)
    sys.stdout.flush()


class Progress:
    """A tqdm bar on a terminal, plain lines when output is a file or pipe.

    Every line goes through `write` (tqdm.write under a bar, so the bar is redrawn below it,
    not overprinted). Plain mode prints every print_interval steps, evaluation steps and the
    last, each with the elapsed time and an ETA from this start's mean step time."""

    def __init__(self, mode: str, total: int, initial: int, print_interval: int):
        tty = sys.stderr.isatty()
        self.total, self.initial = total, initial
        self.print_interval = max(1, print_interval)
        self.t0 = time.perf_counter()
        self.bar = None
        if mode == "bar" or (mode == "auto" and tty):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)
        elif mode not in ("auto", "plain", "bar"):
            raise ValueError(f"logging.progress={mode!r}; valid: auto, bar, plain")

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)  # above the bar, which is redrawn below it
        else:
            print(line, flush=True)

    def eta(self, step: int) -> tuple[float, float]:
        """(elapsed s, remaining s): this start's mean step time times the steps left."""
        elapsed = time.perf_counter() - self.t0
        done = step - self.initial
        return elapsed, (elapsed / done * (self.total - step) if done > 0 else 0.0)

    def update(self, record: dict) -> None:
        """Called every step."""
        step, val = record["step"], record.get("val_loss")
        if self.bar is not None:
            self.bar.set_postfix(
                loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}"
            )
            self.bar.update(1)
            if val is not None or step % self.print_interval == 0:
                self.write(step_line(record, self.total))
        elif step % self.print_interval == 0 or step == self.total or val is not None:
            elapsed, eta = self.eta(step)
            self.write(
                f"{step_line(record, self.total)} | elapsed {clock(elapsed)} | ETA {clock(eta)}"
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
