"""`python -m ufp4_megatron.report.mechanism RUN_DIR [--out DIR]`: the paper's mechanism
(its Figures 6-7) measured on a trained model.

Loads the run's latest checkpoint, runs one batch of held-out data forward and backward in the
run's own recipe, and captures every transformer linear's input x, weight w and output
gradient dy (train/probes.py's hooks). For each GEMM operand, along that GEMM's reduction dim,
and for each 4-bit grid with and without RHT16 (1x16 blocks, FP32 scales, RTNE: the grid is
measured, not one draw of stochastic rounding):

    alpha  = <Q(t), t> / ||t||^2     attenuation; below 1 the grid shrinks the signal
    SQNR   = 10 log10(||t||^2 / ||Q(t) - t||^2), dSQNR = SQNR(RHT16) - SQNR(none)

and, per grid and RHT setting, the product of eta = alpha_A * alpha_B over the quantized GEMMs
of each kind (fprop: the forward signal, dgrad: the backward one), in network order. The
product is the paper's prod(1 - delta_k): a bound on the compounding, not the end-to-end
attenuation, since residual connections route signal around each linear.

Writes <out>/mechanism.md (summary and the full per-layer table), mechanism.json and
mechanism.png; prints the summary. One process per run dir (Megatron's state is global).
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from pathlib import Path

from ..numerics.grids import get_grid
from ..quant import diagnostics as dg
from ..quant.recipe import GEMMS, OPERANDS, reduction_dim

GRIDS = ("e2m1", "e1m2", "int4")
RHTS = (None, 16)
_LINEAR_ORDER = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def load_config(run_dir: Path):
    """The run's resolved config.yaml as the typed schema."""
    from omegaconf import OmegaConf

    from ..train.schema import Config

    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise SystemExit(f"mechanism: {run_dir} has no config.yaml; give a training run dir")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path)))


def capture(run_dir: Path, batch: int | None = None) -> tuple[dict, dict]:
    """({'layer0.linear_qkv': {'x', 'w', 'dy'}, ...}, info) from one batch through the model."""
    from ..train import checkpoint
    from ..train.runtime import decide  # the trainer's own device/dtype rules

    cfg = load_config(run_dir)
    ckpt_dir = Path(cfg.checkpoint.dir or Path(run_dir) / "checkpoints")
    try:  # reads pickles restricted to plain data (train/trust.py): a planted one refused
        step = checkpoint.latest_step(ckpt_dir)
    except checkpoint.CheckpointError as e:
        raise SystemExit(f"mechanism: {e}") from None
    if step is None or not (ckpt_dir / f"step_{step:08d}").is_dir():
        raise SystemExit(
            f"mechanism: no checkpoint under {ckpt_dir}; train the run with "
            f"checkpoint.save_at_end=true (the default) and keep its checkpoints"
        )
    cfg.parallel.tp = cfg.parallel.pp = cfg.parallel.ep = 1  # one process reads the checkpoint
    cfg.parallel.sp = False
    rt = decide(cfg)
    with rt.scope():  # on CPU: the trainer's CUDA shims, undone when the capture ends
        return _capture(cfg, rt, ckpt_dir, step, run_dir, batch)


def _capture(cfg, rt, ckpt_dir: Path, step: int, run_dir: Path, batch: int | None):
    from ..data import datasets as data
    from ..train import checkpoint, distributed, schedule
    from ..train.build import build_run
    from ..train.probes import LayerProbes

    device = rt.device
    t = cfg.train
    mb = batch or t.micro_batch
    built = build_run(cfg, rt, n_train=t.global_batch, n_valid=mb)
    recipe, model, opt, valid = built.recipe, built.model, built.opt, built.valid_ds
    try:
        checkpoint.load(
            ckpt_dir,
            model,
            opt,
            {"policy": built.policy, "lr_schedule": opt.scheduler},
            runtime=rt,
            run=checkpoint.owner(cfg, run_dir),
            run_dir=Path(run_dir),
            verify=cfg.checkpoint.checksums,
        )
    except checkpoint.CheckpointError as e:
        distributed.shutdown()
        raise SystemExit(f"mechanism: {e}") from None
    fwd_model = opt.model  # Megatron's DDP wrapper, as the trainer runs it
    probes = LayerProbes(model, list(range(cfg.model.num_layers)), recipe)
    probes.active = True
    opt.zero_grad()
    schedule.forward_backward(
        fwd_model,
        data.micro_batches(
            valid, 0, global_batch=mb, micro_batch=mb, dp=1, dp_rank=0, device=device
        ),
        n_micro=1,
        seq_len=t.seq_len,
        micro_batch=mb,
        forward_only=False,
    )
    info = {
        "run_dir": str(run_dir),
        "model": cfg.model.name,
        "recipe": cfg.precision.name,
        "seed": t.seed,
        "step": step,
        "tokens": mb * t.seq_len,
        "device": device.type,
        "layers": cfg.model.num_layers,
    }
    captured = dict(probes.captured)
    distributed.shutdown()
    return captured, info


def operand_stats(captured: dict, grids=GRIDS) -> list[dict]:
    """One row per (layer, linear, GEMM, operand, grid): alpha and SQNR without and with RHT16."""
    rows = []
    for key in sorted(captured, key=_network_order):
        layer, linear = key.split(".")
        for gemm in GEMMS:
            for op in OPERANDS[gemm]:
                t = captured[key].get(op)
                dim = reduction_dim(gemm, op)
                if t is None or t.shape[dim] % 16:
                    continue
                t = t.float()
                for grid in grids:
                    row = {
                        "layer": int(layer.removeprefix("layer")),
                        "linear": linear,
                        "gemm": gemm,
                        "operand": op,
                        "grid": grid,
                    }
                    for rht in RHTS:
                        s = dg.quant_stats(t, grid, rht=rht, dim=dim, block=16, scale="fp32")
                        tag = "rht" if rht else "none"
                        row[f"alpha_{tag}"] = s["alpha"]
                        row[f"sqnr_{tag}"] = s["sqnr_db"]
                        row[f"beff_{tag}"] = s["bucket_ratio"]
                    row["dsqnr"] = row["sqnr_rht"] - row["sqnr_none"]
                    rows.append(row)
    return rows


def _network_order(key: str) -> tuple[int, int]:
    layer, linear = key.split(".")
    return int(layer.removeprefix("layer")), _LINEAR_ORDER.index(linear)


def eta_products(rows: list[dict]) -> dict:
    """{(grid, rht, gemm): [cumulative prod of alpha_A * alpha_B in network order]}; dgrad
    runs backward through the network, so its product is accumulated from the last layer."""
    out = {}
    for grid in sorted({r["grid"] for r in rows}):
        for tag in ("none", "rht"):
            for gemm in GEMMS:
                per_linear: dict[tuple, float] = {}
                for r in rows:
                    if r["grid"] == grid and r["gemm"] == gemm:
                        k = (r["layer"], _LINEAR_ORDER.index(r["linear"]))
                        per_linear[k] = per_linear.get(k, 1.0) * r[f"alpha_{tag}"]
                order = sorted(per_linear, reverse=gemm == "dgrad")
                cum, acc = [], 1.0
                for k in order:
                    acc *= per_linear[k]
                    cum.append(acc)
                out[grid, tag, gemm] = cum
    return out


def summary_table(rows: list[dict], products: dict) -> str:
    """Per operand and grid, the mean over layers; then the products over the network."""
    lines = [
        "| GEMM.operand | grid | alpha | alpha RHT16 | SQNR (dB) | SQNR RHT16 | dSQNR |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    grids = list(dict.fromkeys(r["grid"] for r in rows))
    for gemm in GEMMS:
        for op in OPERANDS[gemm]:
            for grid in grids:
                sel = [r for r in rows if (r["gemm"], r["operand"], r["grid"]) == (gemm, op, grid)]
                if not sel:
                    continue
                m = {
                    k: sum(r[k] for r in sel) / len(sel)
                    for k in ("alpha_none", "alpha_rht", "sqnr_none", "sqnr_rht", "dsqnr")
                }
                lines.append(
                    f"| {gemm}.{op} | {grid} | {m['alpha_none']:.4f} | "
                    f"{m['alpha_rht']:.4f} | {m['sqnr_none']:.2f} | {m['sqnr_rht']:.2f} "
                    f"| {m['dsqnr']:+.2f} |"
                )
    lines += [
        "",
        "| grid | RHT16 | prod eta fprop | prod eta dgrad | prod eta wgrad | GEMMs each |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for grid in grids:
        for tag in ("none", "rht"):
            p = {g: products[grid, tag, g] for g in GEMMS}
            lines.append(
                f"| {grid} | {'yes' if tag == 'rht' else 'no'} | "
                + " | ".join(f"{p[g][-1]:.4f}" if p[g] else "-" for g in GEMMS)
                + f" | {len(p['fprop'])} |"
            )
    return "\n".join(lines)


def findings(
    rows: list[dict], products: dict, grid: str = "e2m1", uniform: str = "e1m2"
) -> list[str]:
    """What this model's numbers say, counted, not asserted: how often E2M1 keeps less signal
    than the uniform grid, the products over the forward GEMMs, and where RHT16 helps."""
    by = {(r["layer"], r["linear"], r["gemm"], r["operand"], r["grid"]): r for r in rows}
    keys = sorted({k[:4] for k in by if k[4] == grid and (*k[:4], uniform) in by})
    if not keys:
        return []
    n = len(keys)
    lower = sum(by[(*k, grid)]["alpha_none"] < by[(*k, uniform)]["alpha_none"] for k in keys)
    shrinks = sum(by[(*k, grid)]["alpha_none"] < 1 for k in keys)

    def moved(g: str, sign: int) -> int:  # |dSQNR| under 0.1 dB is no change (paper: < 0.01)
        return sum(sign * by[(*k, g)]["dsqnr"] > 0.1 for k in keys)

    fp = {
        (g, t): products[g, t, "fprop"][-1]
        for g in (grid, uniform)
        for t in ("none", "rht")
        if products.get((g, t, "fprop"))
    }
    k = len(products.get((grid, "none", "fprop"), []))
    return [
        f"- alpha: {grid} keeps less signal than {uniform} on {lower} of {n} operand "
        f"measurements (layer x linear x GEMM operand, no RHT); {grid}'s alpha is below 1 on "
        f"{shrinks} of {n}.",
        f"- through the {k} forward GEMMs, prod(alpha_x alpha_w): {grid} "
        f"{fp.get((grid, 'none'), math.nan):.4f} ({fp.get((grid, 'rht'), math.nan):.4f} with "
        f"RHT16), {uniform} {fp.get((uniform, 'none'), math.nan):.4f} "
        f"({fp.get((uniform, 'rht'), math.nan):.4f}).",
        f"- RHT16 moves SQNR by more than 0.1 dB: {grid} down on {moved(grid, -1)} and up on "
        f"{moved(grid, 1)} of {n} operands; {uniform} up on {moved(uniform, 1)} and down on "
        f"{moved(uniform, -1)}.",
    ]


def full_table(rows: list[dict]) -> str:
    lines = [
        "| layer | linear | GEMM.operand | grid | alpha | alpha RHT16 | SQNR | SQNR RHT16 "
        "| dSQNR | B_eff | B_eff RHT16 |",
        "| --- " * 11 + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layer']} | {r['linear']} | {r['gemm']}.{r['operand']} | {r['grid']} "
            f"| {r['alpha_none']:.4f} | {r['alpha_rht']:.4f} | {r['sqnr_none']:.2f} | "
            f"{r['sqnr_rht']:.2f} | {r['dsqnr']:+.2f} | {r['beff_none']:.3f} | "
            f"{r['beff_rht']:.3f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], products: dict, info: dict, path: Path) -> Path:
    from .plot import pyplot, save_figure

    plt = pyplot()

    grids = list(dict.fromkeys(r["grid"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = dict(zip(grids, ("tab:red", "tab:blue", "tab:green", "tab:purple")))
    ax = axes[0]  # alpha of the forward input x, per linear in network order
    # E1M2 and INT4 are one grid up to scale, so their lines coincide: earlier grids are
    # drawn wider, so both stay visible
    widths = {g: 3.5 - 1.2 * i for i, g in enumerate(grids)}
    for grid in grids:
        sel = [r for r in rows if (r["grid"], r["gemm"], r["operand"]) == (grid, "fprop", "x")]
        for tag, style in (("none", "-"), ("rht", "--")):
            ax.plot(
                range(len(sel)),
                [r[f"alpha_{tag}"] for r in sel],
                style,
                marker=".",
                lw=widths[grid],
                color=colors[grid],
                label=f"{grid}{' + RHT16' if tag == 'rht' else ''}",
            )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(
        xlabel="linear (layer-major: qkv, proj, fc1, fc2)",
        ylabel="alpha of fprop x",
        title="attenuation alpha = <Q(x), x> / ||x||^2",
    )
    ax.legend(fontsize=8)
    ax = axes[1]  # cumulative product of eta through the forward GEMMs
    for grid in grids:
        for tag, style in (("none", "-"), ("rht", "--")):
            cum = products[grid, tag, "fprop"]
            ax.plot(
                range(1, len(cum) + 1),
                cum,
                style,
                color=colors[grid],
                lw=widths[grid],
                label=f"{grid}{' + RHT16' if tag == 'rht' else ''}",
            )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(
        xlabel="fprop GEMMs so far",
        ylabel="prod of alpha_x * alpha_w",
        title="signal kept through the forward GEMMs",
    )
    ax.legend(fontsize=8)
    ax = axes[2]  # dSQNR per operand and grid, mean over layers
    ops = [(g, o) for g in GEMMS for o in OPERANDS[g]]
    width = 0.8 / len(grids)
    for i, grid in enumerate(grids):
        vals = []
        for g, o in ops:
            sel = [r["dsqnr"] for r in rows if (r["grid"], r["gemm"], r["operand"]) == (grid, g, o)]
            vals.append(sum(sel) / len(sel) if sel else math.nan)
        ax.bar(
            [j + i * width for j in range(len(ops))], vals, width, color=colors[grid], label=grid
        )
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ops))])
    ax.set_xticklabels([f"{g}.{o}" for g, o in ops], rotation=30, fontsize=8)
    ax.set(ylabel="dSQNR (dB), mean over layers", title="SQNR(RHT16) - SQNR(none)")
    ax.legend(fontsize=8)
    fig.suptitle(
        f"{info['model']} trained with {info['recipe']} (seed {info['seed']}, step "
        f"{info['step']}): one batch of {info['tokens']} held-out tokens"
    )
    return save_figure(fig, path, dpi=110)


def run(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m ufp4_megatron.report.mechanism", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("run_dir", type=Path, help="a training run dir (config.yaml, checkpoints/)")
    ap.add_argument("--out", type=Path, default=None, help="default: <run_dir>/mechanism")
    ap.add_argument("--grids", default=",".join(GRIDS), help="grids to measure (%(default)s)")
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="sequences in the batch (default: the run's train.micro_batch)",
    )
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|apex|absl).*")
    grids = tuple(g for g in args.grids.split(",") if g)
    for g in grids:
        try:
            get_grid(g)
        except ValueError as e:
            raise SystemExit(f"mechanism: --grids: {e}") from None
    captured, info = capture(args.run_dir, args.batch)
    rows = operand_stats(captured, grids)
    if not rows:
        raise SystemExit(f"mechanism: no linear of {args.run_dir} had an operand to measure")
    products = eta_products(rows)
    out = args.out or args.run_dir / "mechanism"
    out.mkdir(parents=True, exist_ok=True)
    head = (
        f"{info['model']} trained with {info['recipe']} (seed {info['seed']}) at step "
        f"{info['step']}, one held-out batch of {info['tokens']} tokens on {info['device']}; "
        f"1x16 blocks, FP32 scales, RTNE; means over {info['layers']} layers"
    )
    summary = summary_table(rows, products)
    found = "\n".join(findings(rows, products))
    (out / "mechanism.md").write_text(
        f"{head}\n\n{summary}\n\n{found}\n\n## Per layer\n\n{full_table(rows)}\n"
    )
    (out / "mechanism.json").write_text(
        json.dumps(
            {
                "info": info,
                "rows": rows,
                "products": {f"{g}/{t}/{k}": v for (g, t, k), v in products.items()},
            },
            indent=1,
        )
    )
    png = plot(rows, products, info, out / "mechanism.png")
    print(head)
    print(summary)
    print(found)
    print(f"wrote {out / 'mechanism.md'}, {out / 'mechanism.json'} and {png}")
    return {"info": info, "rows": rows, "products": products}


def main(argv: list[str] | None = None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
