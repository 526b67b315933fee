"""Per-layer quantization diagnostics during training (every logging.wandb.diagnostics_interval).

Forward hooks capture each linear's input x and weight w, backward hooks its output gradient
dy, on the chosen transformer layers only. For each GEMM operand the recipe quantizes, the
paper's statistics are computed along that GEMM's reduction dim: attenuation alpha, SQNR,
delta-SQNR of RHT16 and the effective bucket ratio. RTNE is used for all operands so the
numbers measure the grid, not one draw of stochastic rounding.
"""

from __future__ import annotations

import torch

from ..quant import diagnostics as dg
from ..quant.recipe import GEMMS, Recipe, reduction_dim

_LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


class LayerProbes:
    def __init__(self, model: torch.nn.Module, layers: list[int], recipe: Recipe):
        self.recipe = recipe
        self.captured: dict[str, dict[str, torch.Tensor]] = {}
        self.active = False
        self._handles = []
        for name, mod in model.named_modules():
            parts = name.split(".")
            if parts[-1] in _LINEARS and "layers" in parts:
                idx = int(parts[parts.index("layers") + 1])
                if idx in layers:
                    self._hook(f"layer{idx}.{parts[-1]}", mod)

    def _hook(self, key: str, mod: torch.nn.Module) -> None:
        def fwd(m, inputs, output):
            if self.active:
                self.captured.setdefault(key, {})["x"] = inputs[0].detach().flatten(0, -2)
                # grouped experts stack [E, N, K]: as [E*N, K] every block stays in one expert
                self.captured[key]["w"] = m.weight.detach().flatten(0, -2)

        def bwd(m, grad_input, grad_output):
            if self.active and grad_output[0] is not None:
                self.captured.setdefault(key, {})["dy"] = grad_output[0].detach().flatten(0, -2)

        self._handles += [mod.register_forward_hook(fwd), mod.register_full_backward_hook(bwd)]

    def stats(self) -> dict[str, float]:
        """W&B-ready scalars diag/<layer>.<linear>/<gemm>.<operand>/<stat>; clears captures."""
        out = {}
        for key, tensors in self.captured.items():
            for gemm in GEMMS:
                spec = getattr(self.recipe, gemm)
                for op_name, op in self.recipe.operands(gemm):
                    t = tensors.get(op_name)
                    dim = reduction_dim(gemm, op_name)  # captures are 2D natural layouts
                    if op is None or t is None or t.shape[dim] % 16:
                        continue
                    kw = dict(dim=dim, block=op.block, scale=op.scale)
                    s = dg.quant_stats(t.float(), op.grid, rht=spec.rht, **kw)
                    prefix = f"diag/{key}/{gemm}.{op_name}"
                    out[f"{prefix}/alpha"] = s["alpha"]
                    out[f"{prefix}/sqnr_db"] = s["sqnr_db"]
                    out[f"{prefix}/bucket_ratio"] = s["bucket_ratio"]
                    out[f"{prefix}/delta_sqnr_db"] = dg.delta_sqnr(t.float(), op.grid, rht=16, **kw)
        self.captured.clear()
        return out
