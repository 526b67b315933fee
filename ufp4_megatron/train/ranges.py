"""The declared range of every numeric option of the training config.

    RANGES                 dotted key -> Range, one entry per int/float field of the schema
                           (train/schema.py, data.tokenizer's fields included)
    numeric_fields()       (dotted key, type) of every int/float field the schema declares
    check_ranges(cfg)      the first value outside its range -> one line (ValueError)

A type says an option is a number; only a range says which numbers train: `optim.lr=inf`,
`optim.weight_decay=nan` or `model.rotary_base=0` compose, then train to `loss nan` with exit
status 0, and `train.steps=10000000000` runs out of memory building Megatron's dataset index.
Every float must be finite; every int lies below 2**31 unless its range says otherwise (the
sizes, counts and steps that Megatron, numpy and the CUDA kernels index with int32). Relations
between options (min_lr <= lr, seq_len <= max_seq_len, the parallel layout) are
train/validate.py's. tests/train/test_ranges.py enumerates numeric_fields(): a new numeric
field without an entry here fails it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass

INT_LIMIT = 2**31  # default upper bound (exclusive) of an int option
# Optional[int] and int | None: the schema may spell an optional field either way
UNIONS = (typing.Union, types.UnionType)


@dataclass(frozen=True)
class Range:
    """lo <= v (lo < v when lo_open), v < hi (v <= hi when hi_closed); None: unbounded."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_closed: bool = False
    note: str = ""  # said after the bound, e.g. "(0: never)"

    def problem(self, value) -> str | None:
        """None if value is in range, else what it must be ("must be >= 1")."""
        finite = not isinstance(value, float) or math.isfinite(value)
        hi = self.hi if self.hi is not None or isinstance(value, float) else INT_LIMIT
        low = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        high = hi is not None and (value > hi if self.hi_closed else value >= hi)
        if finite and not low and not high:
            return None
        both = self.lo is not None and self.hi is not None
        if not finite or both:
            text = self._both(hi) if both else self._low() or self._high(hi)
            text = " ".join(filter(None, ["a finite number" if not finite else "", text]))
        else:
            text = self._low() if low else self._high(hi)
        return f"must be {text}" + (f" {self.note}" if self.note else "")

    def _low(self) -> str:
        if self.lo is None:
            return ""
        return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"

    def _high(self, hi) -> str:
        return f"{'<=' if self.hi_closed else '<'} {_num(hi)}" if hi is not None else ""

    def _both(self, hi) -> str:
        return (
            f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(hi)}"
            f"{']' if self.hi_closed else ')'}"
        )


def _num(x) -> str:
    if isinstance(x, int) and x >= 2**16 and (x & (x - 1)) == 0:
        return f"2**{x.bit_length() - 1}"
    return f"{x:g}" if isinstance(x, float) else str(x)


def at_least(n: int, note: str = "") -> Range:
    return Range(lo=n, note=note)


def positive(note: str = "") -> Range:
    """A float > 0 (finite)."""
    return Range(lo=0.0, lo_open=True, note=note)


FRACTION = Range(lo=0.0, hi=1.0)  # [0, 1): Adam's betas
ANY_INT = Range(lo=-INT_LIMIT, hi=INT_LIMIT)
SEED_63 = Range(lo=0, hi=2**63)  # seeds that key Philox as two uint32 words (numerics/checks.py)

RANGES: dict[str, Range] = {
    # model
    "model.num_layers": at_least(1),
    "model.hidden_size": at_least(1),
    "model.ffn_hidden_size": at_least(1),
    "model.num_attention_heads": at_least(1),
    "model.num_query_groups": at_least(1),
    "model.kv_channels": at_least(1),
    "model.vocab_size": at_least(1),
    "model.max_seq_len": at_least(1),
    # RoPE's frequencies are base^(-2i/d): 0 and negative bases give NaN, 1 one frequency
    "model.rotary_base": at_least(2),
    "model.init_std": Range(lo=0.0, hi=1.0, lo_open=True, hi_closed=True),
    "model.num_experts": at_least(1),
    "model.moe_router_topk": at_least(1),
    "model.moe_ffn_hidden_size": at_least(1),
    "model.moe_shared_expert_size": at_least(0, "(0 or null: none)"),
    "model.moe_first_dense": at_least(0),
    "model.moe_aux_loss_coeff": Range(lo=0.0),
    "model.moe_capacity_factor": Range(lo=0.0, lo_open=True, note="(null: dropless)"),
    # precision (the recipe checks which blocks, sizes and grids exist)
    "precision.block": at_least(1),
    "precision.rht.size": at_least(1),
    "precision.rht.seed": SEED_63,
    "precision.bf16_layers.start": at_least(0),
    "precision.bf16_layers.end": at_least(0),
    # parallel
    "parallel.tp": at_least(1),
    "parallel.pp": at_least(1),
    "parallel.ep": at_least(1),
    "parallel.dp": at_least(1),
    # data
    "data.corpus_max_bytes": at_least(1),
    "data.corpus_bpe_vocab": at_least(0, "(0: bytes)"),
    "data.tokenizer.vocab_size": at_least(1),
    "data.tokenizer.eod_id": at_least(0),
    "data.tokenizer.tiktoken_num_special_tokens": at_least(0),
    "data.valid_seed": Range(lo=0, hi=2**31, note="(null: train.seed's)"),
    # optim
    "optim.lr": positive(),
    "optim.min_lr": Range(lo=0.0),
    "optim.warmup_steps": at_least(0),
    "optim.decay_steps": at_least(1),
    "optim.wsd_decay_steps": at_least(1),
    "optim.weight_decay": Range(lo=0.0),
    "optim.beta1": FRACTION,
    "optim.beta2": FRACTION,
    "optim.eps": positive(),
    "optim.clip_grad": Range(lo=0.0, note="(0: no clipping)"),
    # train
    "train.steps": at_least(1),
    "train.seed": Range(lo=0, hi=2**31),  # numpy's RandomState (Megatron's shuffling)
    "train.seq_len": at_least(1),
    "train.micro_batch": at_least(1),
    "train.global_batch": at_least(1),
    "train.eval_interval": at_least(0, "(0: never)"),
    "train.eval_iters": at_least(0),
    # eager steps before CUDA-graph capture (train/graphs.py: the kernels compile eagerly first)
    "train.cuda_graph_warmup": at_least(1),
    # logging
    "logging.log_interval": at_least(1),
    "logging.print_interval": at_least(1),
    "logging.peak_tflops": positive(
        "(the GPU's dense BF16 peak in TFLOP/s, e.g. 989 for an "
        "H100 SXM; null: looked up by GPU name)"
    ),
    "logging.wandb.diagnostics_interval": at_least(0, "(0: never)"),
    "logging.wandb.diagnostics_layers": at_least(0),  # each element
    # checkpoint
    "checkpoint.interval": at_least(0, "(0: only at the end and on a stop signal)"),
    "checkpoint.keep": ANY_INT,  # <= 0: keep all
}


def _numeric(tp) -> type | None:
    """int or float for int, float, Optional[...] and list[...] of them; else None."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (*UNIONS, list) and len(args) == 1:
        return _numeric(args[0])
    return tp if tp in (int, float) else None


def numeric_fields(cls=None, prefix: str = "") -> list[tuple[str, type]]:
    """(dotted key, int|float) of every numeric field of the schema (lists: their elements)."""
    from .schema import Config

    cls = Config if cls is None else cls
    out = []
    for name, tp in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = args[0] if typing.get_origin(tp) in UNIONS and len(args) == 1 else tp
        if dataclasses.is_dataclass(inner):
            out += numeric_fields(inner, f"{prefix}{name}.")
        elif (kind := _numeric(tp)) is not None:
            out.append((f"{prefix}{name}", kind))
    return out


def _values(node, prefix: str = ""):
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        if dataclasses.is_dataclass(v):
            yield from _values(v, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", v


def check_ranges(cfg) -> None:
    """ValueError, one line, for the first numeric option of `cfg` (a typed Config) outside
    its range. An option without a declared range still has to be finite and below 2**31."""
    for key, value in _values(cfg):
        items = value if isinstance(value, list) else [value]
        for v in items:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            problem = RANGES.get(key, Range()).problem(v)
            if problem is not None:
                shown = f"{list(value)}: each" if isinstance(value, list) else ""
                raise ValueError(f"{key}={shown or _shown(v)} {problem}")


def _shown(v) -> str:
    return repr(v) if isinstance(v, float) and not math.isfinite(v) else str(v)
