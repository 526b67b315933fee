"""python -m ufp4_megatron.bench [--out docs/performance.md] [--only kernels,layer]"""
from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch


BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def write_between_markers(path: str, body: str) -> None:
    """Replace the text between the bench markers (the notes around them stay)."""
    try:
        old = open(path).read()
    except FileNotFoundError:
        old = f"# Performance\n\n{BEGIN}\n{END}\n"
    if BEGIN not in old or END not in old:
        old = old.rstrip() + f"\n\n{BEGIN}\n{END}\n"
    head, rest = old.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{body}\n{END}{tail}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m ufp4_megatron.bench")
    p.add_argument("--out", help="markdown file to write the tables to")
    p.add_argument("--json", help="also dump the raw rows as JSON here")
    p.add_argument("--only", default="kernels,layer", help="comma list: kernels, layer")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile rows")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("the benchmarks need a CUDA device")
    from . import kernels, layer  # imports triton

    parts = args.only.split(",")
    log = lambda row: print({k: (round(v, 4) if isinstance(v, float) else v)  # noqa: E731
                             for k, v in row.items()}, flush=True)
    raw = {}
    if "kernels" in parts:
        raw["kernels"] = kernels.kernel_rows(compile_shapes=() if args.no_compile else
                                             ((8192, 8192),), log=log)
    if "layer" in parts:
        raw["layer"] = layer.layer_rows(log=log)
    dev = torch.cuda.get_device_name()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "python -m ufp4_megatron.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    text = [f"Device: {dev}; torch {torch.__version__}; {stamp}; command: `{cmd}`", ""]
    if "kernels" in raw:
        text += ["### Kernels (bf16 in and out, grid e1m2, 1x16 fp32 scales)", "",
                 kernels.kernel_table(raw["kernels"]), ""]
    if "layer" in raw:
        text += [f"### Layer ({layer.TOKENS} tokens, forward + backward, dense_1p5b shapes)",
                 "", layer.layer_table(raw["layer"]), ""]
    text += ["### Step", "", "A full training step runs through the trainer, in its own device "
             "call: `python3 tools/gpu_train_matrix.py --suite step` (section Step below).", ""]
    print("\n".join(text))
    if args.out:
        write_between_markers(args.out, "\n".join(text))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1, default=str)


if __name__ == "__main__":
    main()
