"""The trainer's console output (train/logs/log_line.py), unit by unit; no trainer is started.

test_peak_table_by_device_name          PCIe before SXM, unknown GPU and CPU: no peak,
                                        the override wins everywhere
test_flops_per_token_of_tiny_by_hand    6 N + 12 L d s, N counted by hand for model=tiny
test_mfu_only_with_a_peak               tflops_per_gpu always, mfu iff a peak is known
test_step_line_carries_megatrons_fields iteration/total, tokens, ms/it, TFLOP/s, MFU, mem
test_plain_lines_have_elapsed_and_eta   a pipe or file gets elapsed time and ETA
test_bar_lines_do_not_overprint_the_bar under a bar every line goes through tqdm.write
test_summary_line                       done / stopped, last loss, last val loss, run dir
test_params_line_counts_the_model_and_the_rank  total (MoE: active too), this rank's
test_tensorboard_writes_the_logged_scalars    where tensorboard is installed
test_say_goes_through_tqdm_write        messages of other modules mid-run, the same way
"""

from __future__ import annotations

import pytest

from ufp4_megatron.train.footprint import load_config
from ufp4_megatron.train.logs import log_line

RECORD = {
    "step": 20,
    "loss": 4.81234,
    "lr": 3e-4,
    "grad_norm": 0.8123,
    "tokens": 163840,
    "step_time": 0.0612,
    "tokens_per_s": 133856.0,
}


@pytest.mark.parametrize(
    "name, override, expected",
    [
        ("NVIDIA H100 80GB HBM3", None, 989.0),
        ("NVIDIA H100 PCIe", None, 756.0),
        ("NVIDIA H200", None, 989.0),
        ("NVIDIA A100-SXM4-80GB", None, 312.0),
        ("NVIDIA GeForce RTX 4090", None, None),  # not in the table: no MFU, not a guess
        (None, None, None),  # CPU
        ("NVIDIA GeForce RTX 4090", 165.0, 165.0),
        (None, 100.0, 100.0),
    ],
)
def test_peak_table_by_device_name(name, override, expected):
    assert log_line.peak_tflops(name, override) == expected


def test_flops_per_token_of_tiny_by_hand():
    m = load_config(["model=tiny"]).model  # h 128, 2 layers, 4 heads of 32, 2 KV groups
    attn = 128 * 32 * (4 + 2 * 2) + 4 * 32 * 128
    mlp = 3 * 128 * 352
    head = 384 * 128  # untied output layer; the input embedding is a lookup
    n = 2 * (attn + mlp) + head
    for s in (32, 1024):
        assert log_line.flops_per_token(m, s) == 6 * n + 12 * 2 * 4 * 32 * s


def test_mfu_only_with_a_peak():
    got = log_line.throughput(tokens=1000, seconds=0.5, flops_token=1e9, world_size=2, peak=None)
    assert got == {"tflops_per_gpu": pytest.approx(1e9 * 1000 / 0.5 / 2 / 1e12)}
    got = log_line.throughput(tokens=1000, seconds=0.5, flops_token=1e9, world_size=2, peak=2.0)
    assert got["mfu"] == pytest.approx(got["tflops_per_gpu"] / 2.0)


def test_step_line_carries_megatrons_fields():
    line = log_line.step_line(
        RECORD | {"tflops_per_gpu": 11.94, "mfu": 0.0121, "mem_gib": 3.1, "val_loss": 4.9},
        total=200,
    )
    for part in (
        "step 20 of 200",
        "tokens 164k",
        "loss 4.8123",
        "val_loss 4.9000",
        "lr 3.00e-04",
        "grad_norm 0.812",
        "61.2 ms/it",
        "134k tok/s",
        "11.9 TFLOP/s/GPU",
        "MFU 1.2%",
        "mem 3.10 GiB",
    ):
        assert part in line.split(" | "), (part, line)
    cpu = log_line.step_line(RECORD | {"tflops_per_gpu": 0.001, "max_rss_gib": 0.5}, total=200)
    assert "MFU" not in cpu and "rss 0.50 GiB" in cpu and "val_loss" not in cpu


def test_plain_lines_have_elapsed_and_eta(capsys, monkeypatch):
    clock = iter([100.0, 110.0])  # start; then 10 s after 5 of 20 remaining-to-train steps
    monkeypatch.setattr(log_line.time, "perf_counter", lambda: next(clock))
    p = log_line.Progress("plain", total=25, initial=5, print_interval=10)
    p.update(RECORD | {"step": 10})
    out = capsys.readouterr().out.strip()
    # 10 s for 5 steps: 2 s each, 15 steps left
    assert out.endswith("| elapsed 0:00:10 | ETA 0:00:30"), out
    assert out.startswith("step 10 of 25 |")


def test_bar_lines_do_not_overprint_the_bar(capsys, monkeypatch):
    from tqdm import tqdm

    written, real = [], tqdm.write.__func__

    def spy(cls, s, *args, **kwargs):  # the real tqdm.write, recorded
        written.append(s)
        return real(cls, s, *args, **kwargs)

    monkeypatch.setattr(tqdm, "write", classmethod(spy))
    p = log_line.Progress("bar", total=4, initial=0, print_interval=2)
    p.update(RECORD | {"step": 1})
    p.update(RECORD | {"step": 2})
    p.write("checkpoint: saved step 2 in 0.1 s")
    p.close()
    out = capsys.readouterr().out.splitlines()
    # every line went through tqdm.write (which clears the bar, writes, redraws it)
    assert written == out and len(out) == 2
    assert out[0].startswith("step 2 of 4 | ") and out[1] == "checkpoint: saved step 2 in 0.1 s"


def test_summary_line():
    recs = [RECORD | {"step": 19, "val_loss": 5.0}, RECORD]
    line = log_line.summary_line(
        recs, start=10, total=200, wall_s=3725, run_dir="runs/x", stopped=False
    )
    assert line == (
        "done: steps 11-20 of 200 in 1:02:05 (wall), loss 4.8123, "
        "val loss 5.0000 (step 19); run dir runs/x"
    )
    stopped = log_line.summary_line(
        recs[:1], start=0, total=200, wall_s=1, run_dir="r", stopped=True
    )
    assert stopped.startswith("stopped: steps 1-19 of 200")
    assert "no step" in log_line.summary_line(
        [], start=5, total=5, wall_s=0, run_dir="r", stopped=False
    )


def test_params_line_counts_the_model_and_the_rank():
    m = load_config(["model=moe_small"]).model
    line = log_line.params_line(m, local=123, world_size=4)
    assert line.startswith("model moe_small: 30,")  # 30.4M total (configs/model/moe_small.yaml)
    assert "active per token" in line and line.endswith("rank 0 holds 123 of 4 ranks")


def test_tensorboard_writes_the_logged_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ufp4_megatron.train.logs.tensorboard_log import TensorBoard

    tb = TensorBoard(tmp_path)
    tb.log(RECORD | {"step": 1, "val_loss": float("nan")})  # a NaN is not written
    tb.log(RECORD | {"step": 2, "loss": 4.5})
    tb.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [
        (1, pytest.approx(4.81234)),
        (2, 4.5),
    ]
    assert "val_loss" not in acc.Tags()["scalars"]


def test_say_goes_through_tqdm_write(capsys, monkeypatch):
    """Messages of other parts mid-run (train/live_gap.py) do not overprint the bar either."""
    from tqdm import tqdm

    written, real = [], tqdm.write.__func__
    monkeypatch.setattr(
        tqdm,
        "write",
        classmethod(lambda cls, s, *a, **k: (written.append(s), real(cls, s, *a, **k))[1]),
    )
    log_line.say("live gap: gap_vs_bf16 from runs/x")
    assert written == ["live gap: gap_vs_bf16 from runs/x"]
    assert capsys.readouterr().out == "live gap: gap_vs_bf16 from runs/x\n"
