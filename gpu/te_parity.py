"""TransformerEngine modules with ufp4_megatron.te's factories against the local route, on a GPU.

Driver of gpu/te_check.sh (part "parity"); needs TransformerEngine >= 2.19 (gpu/te_setup.sh).
For each module and recipe, the same weights and inputs go through
  TE:     te.Linear / te.LayerNormLinear / te.GroupedLinear under fp8_autocast with
          CustomRecipe(qfactory=ufp4_megatron.te.<recipe>), fuse_wgrad_accumulation into an
          fp32 weight.main_grad, is_first_microbatch True then False (TE caches the quantized
          weight), several micro-batches;
  local:  ops.quantized_linear (the local route's autograd function) on the same operands
          (LayerNormLinear: TE's RMSNorm, then the local linear), its BF16 weight gradient
          added into an fp32 main_grad per micro-batch, as the plugin's parallel linears do.
Each micro-batch gives both routes one SR call seed (ufp4_megatron.te.seeds.fixed), so they
draw the same bits. Compared: forward output, dX, main_grad after all micro-batches (and the
norm's weight gradient): bitwise where the GEMMs agree, else within BF16 GEMM rounding
(relative Frobenius difference <= 1e-2; the quantization's own error is ~1e-1, checked too).
Also: the CUDA generator as the SR stream (a restored state redraws the same bits; the next
draw differs) and the refusals that need TE (FP4 parameters, backward_override, sequence
parallelism, through the call TE makes on a column-parallel input's quantizer).

    python3 gpu/te_parity.py --out DIR       (writes DIR/te_parity.json, prints the table)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ufp4_megatron.quant import ops  # noqa: E402
from ufp4_megatron.quant.recipe import PRESETS  # noqa: E402

TOL = 1e-2  # relative Frobenius difference of BF16 GEMM outputs computed in another order
ROWS: list[dict] = []


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def compare(module: str, recipe: str, quantity: str, te_val, local_val, tol: float = TOL):
    bitwise = torch.equal(te_val, local_val.to(te_val.dtype))
    r = rel(te_val, local_val)
    ok = bool(torch.isfinite(te_val).all()) and r <= tol
    ROWS.append(
        dict(
            module=module,
            recipe=recipe,
            quantity=quantity,
            bitwise=bitwise,
            rel_diff=r,
            tol=tol,
            ok=ok,
        )
    )


def record(module: str, recipe: str, quantity: str, ok: bool, detail: str = ""):
    ROWS.append(
        dict(
            module=module,
            recipe=recipe,
            quantity=quantity,
            bitwise=None,
            rel_diff=None,
            tol=None,
            ok=bool(ok),
            detail=detail,
        )
    )


def custom(name: str, **kw):
    from transformer_engine.common.recipe import CustomRecipe

    import ufp4_megatron.te as ute

    return CustomRecipe(qfactory=getattr(ute, name), **kw)


def autocast(recipe):
    import transformer_engine.pytorch as te

    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)


def _data(m, k, n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    dy = (torch.randn(m, n, device="cuda", generator=g) * 1e-2).bfloat16()
    return x, dy


def _fresh_main_grad(*weights):
    for w in weights:
        w.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)


def linear(name: str, micro: int = 3, m: int = 256, k: int = 512, n: int = 384):
    import transformer_engine.pytorch as te

    from ufp4_megatron.te import seeds

    recipe = PRESETS[name]
    torch.manual_seed(1)
    layer = te.Linear(
        k, n, bias=False, params_dtype=torch.bfloat16, fuse_wgrad_accumulation=True, device="cuda"
    )
    w = layer.weight
    _fresh_main_grad(w)
    w_local = w.detach().clone().requires_grad_(True)
    main_local = torch.zeros(n, k, dtype=torch.float32, device="cuda")
    for mb in range(micro):
        x, dy = _data(m, k, n, 100 + mb)
        call = 7000 + mb
        xt = x.clone().requires_grad_(True)
        with seeds.fixed(call), autocast(custom(name)):
            y = layer(xt, is_first_microbatch=mb == 0)
        with seeds.fixed(call):
            y.backward(dy)
        xl = x.clone().requires_grad_(True)
        yl = ops.quantized_linear(xl, w_local, None, recipe, seed=call)
        yl.backward(dy)
        main_local += w_local.grad.float()
        w_local.grad = None
        compare("Linear", name, f"y (micro-batch {mb})", y.detach(), yl.detach())
        compare("Linear", name, f"dX (micro-batch {mb})", xt.grad, xl.grad)
        if mb == 0:
            with torch.no_grad():
                y_bf16 = layer(x)
            q = rel(y.detach(), y_bf16)
            record("Linear", name, "y differs from TE BF16 (quantized)", q > 1e-3, f"rel {q:.3g}")
    compare(
        "Linear",
        name,
        f"main_grad ({micro} micro-batches, fused accumulation)",
        w.main_grad,
        main_local,
    )
    assert w.grad is None or not w.grad.any()


def layernorm_linear(name: str, micro: int = 2, m: int = 256, k: int = 512, n: int = 768):
    import transformer_engine.pytorch as te

    from ufp4_megatron.te import seeds

    recipe = PRESETS[name]
    torch.manual_seed(2)
    layer = te.LayerNormLinear(
        k,
        n,
        bias=False,
        normalization="RMSNorm",
        params_dtype=torch.bfloat16,
        fuse_wgrad_accumulation=True,
        device="cuda",
    )
    with torch.no_grad():
        layer.layer_norm_weight.uniform_(0.5, 1.5)
    norm = te.RMSNorm(k, params_dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        norm.weight.copy_(layer.layer_norm_weight)
    w = layer.weight
    _fresh_main_grad(w)
    w_local = w.detach().clone().requires_grad_(True)
    main_local = torch.zeros(n, k, dtype=torch.float32, device="cuda")
    for mb in range(micro):
        x, dy = _data(m, k, n, 200 + mb)
        call = 8000 + mb
        xt = x.clone().requires_grad_(True)
        with seeds.fixed(call), autocast(custom(name)):
            y = layer(xt, is_first_microbatch=mb == 0)
        with seeds.fixed(call):
            y.backward(dy)
        xl = x.clone().requires_grad_(True)
        yl = ops.quantized_linear(norm(xl), w_local, None, recipe, seed=call)
        yl.backward(dy)
        main_local += w_local.grad.float()
        w_local.grad = None
        compare("LayerNormLinear", name, f"y (micro-batch {mb})", y.detach(), yl.detach())
        compare("LayerNormLinear", name, f"dX (micro-batch {mb})", xt.grad, xl.grad)
    compare("LayerNormLinear", name, f"main_grad ({micro} micro-batches)", w.main_grad, main_local)
    compare(
        "LayerNormLinear", name, "norm weight grad", layer.layer_norm_weight.grad, norm.weight.grad
    )


def grouped_linear(name: str, micro: int = 2, splits=(128, 64, 16, 48), k: int = 256, n: int = 384):
    import transformer_engine.pytorch as te

    from ufp4_megatron.te import seeds

    recipe = PRESETS[name]
    torch.manual_seed(3)
    e = len(splits)
    layer = te.GroupedLinear(
        e,
        k,
        n,
        bias=False,
        params_dtype=torch.bfloat16,
        fuse_wgrad_accumulation=True,
        device="cuda",
    )
    weights = [getattr(layer, f"weight{i}") for i in range(e)]
    _fresh_main_grad(*weights)
    local_w = [w.detach().clone().requires_grad_(True) for w in weights]
    main_local = [torch.zeros(n, k, dtype=torch.float32, device="cuda") for _ in weights]
    m = sum(splits)
    for mb in range(micro):
        x, dy = _data(m, k, n, 300 + mb)
        call = 9000 + mb
        xt = x.clone().requires_grad_(True)
        with seeds.fixed(call), autocast(custom(name)):
            y = layer(xt, list(splits), is_first_microbatch=mb == 0)
        with seeds.fixed(call):
            y.backward(dy)
        xl = x.clone().requires_grad_(True)
        ys = [
            ops.quantized_linear(xi, wi, None, recipe, seed=call)
            for xi, wi in zip(torch.split(xl, list(splits)), local_w)
        ]
        yl = torch.cat(ys)
        yl.backward(dy)
        for i, wi in enumerate(local_w):
            main_local[i] += wi.grad.float()
            wi.grad = None
        compare("GroupedLinear", name, f"y (micro-batch {mb})", y.detach(), yl.detach())
        compare("GroupedLinear", name, f"dX (micro-batch {mb})", xt.grad, xl.grad)
    for i, w in enumerate(weights):
        compare(
            "GroupedLinear",
            name,
            f"main_grad expert {i} ({micro} micro-batches)",
            w.main_grad,
            main_local[i],
        )


def sr_stream():
    """SR seeds from the CUDA generator: a restored generator state redraws the same bits (a
    resumed run), the stream goes on otherwise, and each draw advances the offset by 4."""
    import transformer_engine.pytorch as te

    torch.manual_seed(4)
    layer = te.Linear(512, 256, bias=False, params_dtype=torch.bfloat16, device="cuda")
    x, dy = _data(256, 512, 256, 400)
    gen = torch.cuda.default_generators[torch.cuda.current_device()]

    def grads():
        layer.weight.grad = None
        xt = x.clone().requires_grad_(True)
        with autocast(custom("ufp4")):
            y = layer(xt)
        y.backward(dy)
        return xt.grad.clone(), layer.weight.grad.clone()

    torch.cuda.manual_seed(11)
    state, off0 = torch.cuda.get_rng_state(), gen.get_offset()
    a = grads()
    drawn = gen.get_offset() - off0
    torch.cuda.set_rng_state(state)
    b = grads()
    c = grads()
    record(
        "SR stream",
        "ufp4",
        "restored CUDA RNG state: the same dX and dW, bitwise",
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]),
    )
    record(
        "SR stream",
        "ufp4",
        "next draws: other dX and dW",
        not torch.equal(a[0], c[0]) and not torch.equal(a[1], c[1]),
    )
    record(
        "SR stream",
        "ufp4",
        "one backward draws dY's two layouts (offset +8)",
        drawn == 8,
        f"offset +{drawn}",
    )


def refusals():
    import transformer_engine.pytorch as te

    def refused(what, fn, fragment):
        try:
            fn()
        except ValueError as e:
            record("refusal", "ufp4", what, fragment in str(e), str(e)[:160])
            return
        except Exception as e:
            record("refusal", "ufp4", what, False, f"{type(e).__name__}: {str(e)[:160]}")
            return
        record("refusal", "ufp4", what, False, "not refused")

    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)

    def fp4_params():
        with te.fp8_model_init(enabled=True, recipe=custom("ufp4")):
            layer = te.Linear(256, 256, params_dtype=torch.bfloat16, device="cuda")
        with autocast(custom("ufp4")):
            layer(x)

    def backward_override():
        layer = te.Linear(256, 256, params_dtype=torch.bfloat16, device="cuda")
        with autocast(custom("ufp4", backward_override="high_precision")):
            layer(x)

    def sequence_parallel():
        # TE marks a column-parallel input quantizer this way under sequence parallelism
        # (module/linear.py: the group is the TP group); one GPU cannot hold a TP group of 2,
        # so TE's own call is made here on the factory's input quantizer
        from transformer_engine.pytorch.module._common import set_quantizer_amax_reduction_group
        from transformer_engine.pytorch.quantization import QuantizerRole

        import ufp4_megatron.te as ute

        q = ute.ufp4(QuantizerRole(module_type="linear", tensor_type="input"))
        set_quantizer_amax_reduction_group(q, object())
        q(x)

    refused("--fp4-param-gather (fp8_model_init)", fp4_params, "FP4 parameters")
    refused("backward_override=high_precision", backward_override, "backward_override")
    refused(
        "sequence parallelism (TE's amax-group call on a column-parallel input)",
        sequence_parallel,
        "sequence parallelism",
    )


def table() -> str:
    lines = [
        "| module | recipe | quantity | bitwise | rel. diff | result |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in ROWS:
        bit = "-" if r["bitwise"] is None else ("yes" if r["bitwise"] else "no")
        diff = r.get("detail") or (
            "-" if r["rel_diff"] is None else f"{r['rel_diff']:.2e} (<= {r['tol']:g})"
        )
        lines.append(
            f"| {r['module']} | {r['recipe']} | {r['quantity']} | {bit} | {diff} | "
            f"{'PASS' if r['ok'] else 'FAIL'} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--recipes",
        default="ufp4,e2m1,ufp4_int4,nvfp4,mxfp4",
        help="recipes for te.Linear; LayerNormLinear and GroupedLinear run ufp4, e2m1",
    )
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("NVTE_DEBUG", "0")
    t0 = time.time()
    import transformer_engine

    steps = [(f"Linear {r}", lambda r=r: linear(r)) for r in a.recipes.split(",")]
    steps += [(f"LayerNormLinear {r}", lambda r=r: layernorm_linear(r)) for r in ("ufp4", "e2m1")]
    steps += [(f"GroupedLinear {r}", lambda r=r: grouped_linear(r)) for r in ("ufp4", "e2m1")]
    steps += [("SR stream", sr_stream), ("refusals", refusals)]
    for label, fn in steps:
        try:
            fn()
        except Exception as e:
            record(
                label.split()[0],
                label.split()[-1],
                "ran",
                False,
                f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
            )
            traceback.print_exc()
        print(f"te_parity: {label} done at {time.time() - t0:.0f} s", flush=True)
    text = table()
    (a.out / "te_parity.json").write_text(
        json.dumps(
            {
                "te": transformer_engine.__version__,
                "gpu": torch.cuda.get_device_name(),
                "seconds": round(time.time() - t0, 1),
                "rows": ROWS,
            },
            indent=1,
        )
    )
    print(text)
    return 0 if all(r["ok"] for r in ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
