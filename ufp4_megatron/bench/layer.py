"""Layer table: one linear layer forward + backward (dX and dW) at Dense-1.5B shapes,
UFP4 (and the E2M1 baseline) through quantized_linear vs BF16 F.linear, 8192 tokens."""

from __future__ import annotations

import pathlib

import torch

from ..quant.ops import quantized_linear
from ..quant.recipe import get_recipe
from .timing import median_ms, peak_bytes

TOKENS = 8192


def dense_1p5b_shapes() -> dict[str, tuple[int, int]]:
    """(in, out) features of qkv, proj, fc1 (SwiGLU: 2 x ffn), fc2 from configs/model."""
    cfg = {
        "hidden_size": 2048,
        "ffn_hidden_size": 5632,
        "num_attention_heads": 16,
        "num_query_groups": 4,
    }
    path = pathlib.Path(__file__).resolve().parents[1] / "configs/model/dense_1p5b.yaml"
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() in cfg and val.strip():
                cfg[key.strip()] = int(val.split("#")[0])
    h, f = cfg["hidden_size"], cfg["ffn_hidden_size"]
    kv = h // cfg["num_attention_heads"] * cfg["num_query_groups"]
    return {"qkv": (h, h + 2 * kv), "proj": (h, h), "fc1": (h, 2 * f), "fc2": (f, h)}


def _step(recipe):
    def run(args):
        x, w, dy = args
        if recipe is None:
            y = torch.nn.functional.linear(x, w)
        else:
            y = quantized_linear(x, w, None, recipe, seed=7)
        return torch.autograd.grad(y, (x, w), dy)

    return run


def _graphed(fn, args):
    """fn(args) captured in a CUDA graph (replays carry no Python/launch overhead), or None."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(args)
        return graph
    except Exception as e:  # report and go on: the eager rows stand on their own
        print(f"graph capture failed: {e!r}"[:300])
        return None


def layer_rows(recipes=("ufp4",), log=print) -> list[dict]:
    rows = []
    for name, (k, n) in dense_1p5b_shapes().items():

        def make():
            x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16).requires_grad_()
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
            return (
                x,
                w.requires_grad_(),
                torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16),
            )

        inputs = [make() for _ in range(2)]
        base = median_ms(_step(None), inputs)
        base_mem = peak_bytes(_step(None), inputs[0])
        rows.append(
            dict(
                layer=name,
                k=k,
                n=n,
                recipe="bf16",
                ms=base,
                ratio=1.0,
                mem=base_mem / 2**20,
                mem_ratio=1.0,
            )
        )
        log(rows[-1])
        for r in recipes:
            recipe = get_recipe(r)
            ms = median_ms(_step(recipe), inputs)
            mem = peak_bytes(_step(recipe), inputs[0])
            rows.append(
                dict(
                    layer=name,
                    k=k,
                    n=n,
                    recipe=r,
                    ms=ms,
                    ratio=ms / base,
                    mem=mem / 2**20,
                    mem_ratio=mem / base_mem,
                )
            )
            log(rows[-1])
        # the same steps replayed from CUDA graphs: GPU time without host overhead
        graphs = {"bf16": _graphed(_step(None), inputs[0])}
        graphs.update({r: _graphed(_step(get_recipe(r)), inputs[0]) for r in recipes})
        if all(g is not None for g in graphs.values()):
            g_base = median_ms(lambda g: g.replay(), [graphs["bf16"]])
            for r, g in graphs.items():
                ms = median_ms(lambda g: g.replay(), [g])
                rows.append(
                    dict(
                        layer=name,
                        k=k,
                        n=n,
                        recipe=f"{r} (CUDA graph)",
                        ms=ms,
                        ratio=ms / g_base,
                        mem=float("nan"),
                        mem_ratio=float("nan"),
                    )
                )
                log(rows[-1])
        del graphs
        del inputs
        torch.cuda.empty_cache()
    return rows


def layer_table(rows: list[dict]) -> str:
    out = [
        "| layer | in x out | recipe | fwd+bwd ms | x BF16 | peak extra MiB | x BF16 |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['layer']} | {r['k']}x{r['n']} | {r['recipe']} | {r['ms']:.3f} | "
            f"{r['ratio']:.2f} | {r['mem']:.0f} | {r['mem_ratio']:.2f} |"
        )
    return "\n".join(out)
