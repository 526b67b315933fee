"""The training config schema: one keyword-only dataclass per Hydra group.

Hydra merges every YAML under `ufp4_megatron/configs/` into these dataclasses, so an unknown key or a value
of the wrong type fails at start with the full key in the message. YAML keys equal the field
names below; see docs/training.md for the command-line contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING

from ..data.tokenizers import TokenizerConfig  # `data.tokenizer`; prepare_data builds the same
from .precision_resolvers import (
    PRESET_RESOLVER,
    register_ablation_resolver,
    register_preset_resolver,
)


@dataclass(kw_only=True)
class ModelConfig:
    """A Megatron-Core GPT: pre-norm blocks with GQA, RoPE, RMSNorm and SwiGLU, no biases."""

    name: str = MISSING
    num_layers: int = MISSING
    hidden_size: int = MISSING
    ffn_hidden_size: int = MISSING  # SwiGLU width of dense layers (fc1 is 2x this)
    num_attention_heads: int = MISSING
    num_query_groups: int = MISSING  # GQA: key/value heads
    kv_channels: int | None = None  # head dim; None: hidden_size / num_attention_heads
    vocab_size: int = 384  # rows of the embedding; >= the tokenizer's (258 for bytes)
    max_seq_len: int = 4096  # RoPE has no position table; this only bounds train.seq_len
    rotary_base: int = 10000
    untie_embeddings: bool = True  # separate output head (Megatron's default for GPT-3 style)
    init_std: float = 0.02
    cpu_init: bool | None = None  # None: on CPU only; true: TP-layout-invariant weights
    # linears: local (the plugin's UFP4 linears in Megatron's local spec) or transformer_engine
    # (Megatron's TE spec, UFP4 through TE's custom FP4 recipe: train/te_route.py; needs TE)
    transformer_impl: str = "local"
    # core attention, the same for every recipe: sdpa (PyTorch's fused kernels, no mask
    # tensor), te (TransformerEngine, when installed), megatron (unfused, materialised mask)
    attention_backend: str = "sdpa"
    sdpa_kernels: list[str] | None = None  # e.g. [cudnn, flash]; None: PyTorch's choice
    # Megatron's fused cross entropy (--cross-entropy-loss-fusion, the native impl: torch.compile
    # of its vocab-parallel loss), the same for every recipe. Off by default, as in Megatron:
    # the studies' runs were trained with the unfused loss, whose fp32 sums round differently
    cross_entropy_fusion: bool = False
    # MoE (num_experts None: dense). Routed experts use moe_ffn_hidden_size, one shared expert
    # of moe_shared_expert_size runs on every token, the first moe_first_dense layers are dense.
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_size: int | None = None
    moe_first_dense: int = 0
    moe_aux_loss_coeff: float = 1e-3
    moe_grouped_gemm: bool = True  # all experts' GEMMs at once; false: one MLP per expert
    # tokens per expert capped at capacity_factor * tokens * topk / experts (None: dropless),
    # and with moe_pad_to_capacity every expert's input padded to that capacity: static
    # shapes, what CUDA graphs of an MoE model need (train.cuda_graph)
    moe_capacity_factor: float | None = None
    moe_pad_to_capacity: bool = False


def _preset(key: str) -> Any:
    # Unset: the value precision.recipe's preset states (train/precision.py), resolved into
    # the run's config.yaml, so a precision YAML that omits rht or sr runs its preset's.
    return II(f"{PRESET_RESOLVER}:${{..recipe}},{key}")


@dataclass(kw_only=True)
class RhtConfig:
    """Random Hadamard transform per GEMM (both operands, along the reduction dim)."""

    fprop: bool | None = _preset("rht.fprop")
    dgrad: bool | None = _preset("rht.dgrad")
    wgrad: bool | None = _preset("rht.wgrad")
    size: int | None = _preset("rht.size")
    seed: int | None = _preset("rht.seed")  # one fixed sign vector per run, on all ranks


@dataclass(kw_only=True)
class SrConfig:
    """Stochastic rounding per operand name (x, w, dy); RTNE where false."""

    x: bool | None = _preset("sr.x")
    w: bool | None = _preset("sr.w")
    dy: bool | None = _preset("sr.dy")


@dataclass(kw_only=True)
class Bf16LayersConfig:
    """Transformer layers kept in BF16: the first `start` and the last `end`."""

    start: int = 0
    end: int = 0


@dataclass(kw_only=True)
class PrecisionConfig:
    """A preset of ufp4_megatron.quant.recipe.get_recipe plus its overrides.

    grid/block/scale/block_2d None keep the preset's values; every rht and sr switch left
    unset is the preset's (resolved from `recipe`), so `precision.rht.fprop=false` or
    `precision.sr.dy=false` edit one switch of it.
    """

    # label used in run names and reports; the package's YAMLs name an override ablation
    # after what it changes (train/precision_resolvers.py: ufp4-rht.fprop=false)
    name: str = MISSING
    recipe: str = MISSING  # a name from list_recipes()
    grid: str | None = None
    block: int | None = None
    scale: str | None = None
    block_2d: bool | None = None
    # any other Recipe field by its get_recipe path, e.g. +precision.overrides.fprop.x.grid=e2m1
    # or +precision.overrides.wgrad.rht=null
    overrides: dict[str, Any] = field(default_factory=dict)
    rht: RhtConfig = field(default_factory=RhtConfig)
    sr: SrConfig = field(default_factory=SrConfig)
    bf16_layers: Bf16LayersConfig = field(default_factory=Bf16LayersConfig)


@dataclass(kw_only=True)
class ParallelConfig:
    """Megatron parallel sizes; data parallel is what is left of the world size."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    sp: bool = False  # sequence parallel (needs tp > 1)
    dp: int | None = None  # None: world_size / (tp * pp); a number is checked against it
    distributed_optimizer: bool = True  # Megatron's distributed optimizer (GPU and CPU)
    backend: str = "auto"  # auto: nccl with CUDA, gloo without


@dataclass(kw_only=True)
class DataConfig:
    """Indexed (.bin/.idx) token data read through Megatron's GPTDataset."""

    # Megatron blend: ["prefix"] or ["0.7", "a", "0.3", "b"]; empty: the embedded corpus,
    # tokenized on first use into cache_dir.
    prefixes: list[str] = field(default_factory=list)
    split: str = "98,2,0"
    cache_dir: str = "data/cache"  # the embedded corpus, its BPE, Megatron's index cache
    corpus_max_bytes: int = 8_000_000  # size of the embedded corpus when prefixes is empty
    # Embedded corpus only: 0 tokenizes it to bytes; N trains a byte-level BPE of N tokens on
    # it once into cache_dir (data=embedded_bpe; tokenizer: huggingface with path null).
    corpus_bpe_vocab: int = 0
    # The tokenizer the data was made with: its EOD/pad ids and vocabulary are checked
    # against model.vocab_size and the data at start (data/tokenizers.py).
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    # The shuffling seed of the validation split. null: train.seed's, so each seed validates
    # on other samples of the held-out documents; a number: every run validates on the same
    # samples whatever its seed (a fixed validation set shared by a study's seeds).
    valid_seed: int | None = None


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW with global-norm clipping; LR through Megatron-Core's OptimizerParamScheduler:
    linear warmup, then decay_style from lr to min_lr over decay_steps (see train/optim.py)."""

    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 100
    decay_style: str = "cosine"  # cosine | linear | constant | inverse-square-root | WSD
    decay_steps: int | None = None  # None: train.steps (the value of the run's first start)
    wsd_decay_steps: int | None = None  # WSD: length of the final decay (needed for WSD)
    wsd_decay_style: str = "linear"  # WSD's final decay: linear | cosine | exponential | minus_sqrt
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip_grad: float = 1.0
    # the Adam kernel: auto = TE/Apex FusedAdam where installed (Megatron-Core's choice),
    # else torch AdamW fused (one kernel per step); foreach = torch's multi-pass AdamW
    adam_kernel: str = "auto"  # auto | fused | foreach


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = 1000
    seed: int = 1234
    seq_len: int = 1024
    micro_batch: int = 1  # sequences per rank per forward pass
    global_batch: int = 8  # sequences per optimizer step (micro_batch * dp * accumulation)
    # steps between validation passes on the held-out split (data.split's second part), and
    # at the last step, as Megatron-LM's --eval-interval (default 1000); 0: never
    eval_interval: int = 1000
    eval_iters: int = 4  # validation batches per pass (of global_batch sequences each)
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: str = "auto"  # params/activations: auto = bf16 on CUDA, fp32 on CPU
    # the same bits from the same command, run after run and across resumes, slower: Megatron's
    # deterministic_mode, torch.use_deterministic_algorithms, cuBLAS/NCCL settings
    # (train/determinism.py; its cost: docs/training.md)
    deterministic: bool = False
    # CUDA graphs (Megatron-Core's cuda_graph_impl): none | local (one graph per transformer
    # layer, forward and backward) | full_iteration (all micro-batches' forward and backward
    # in one graph); captured after cuda_graph_warmup eager steps
    cuda_graph: str = "none"
    cuda_graph_warmup: int = 3
    # weights' RTNE operands kept from one optimizer step to the next (bit for bit the same
    # results, for memory): auto (all where the estimate fits the device, else experts, else
    # none) | all | experts | none
    weight_cache: str = "auto"


@dataclass(kw_only=True)
class WandbConfig:
    mode: str = "auto"  # auto: online iff WANDB_API_KEY is set, else offline | online | disabled
    project: str = "ufp4-megatron"
    entity: str | None = None
    dir: str | None = None  # None: the run dir
    diagnostics_interval: int = 0  # steps between per-layer diagnostics; 0: never
    diagnostics_layers: list[int] = field(default_factory=lambda: [0])


@dataclass(kw_only=True)
class LoggingConfig:
    log_interval: int = 1  # steps between metrics.jsonl lines
    progress: str = "auto"  # auto: a tqdm bar on a TTY, plain lines otherwise | bar | plain
    print_interval: int = 10  # steps between printed step lines (train/logs/log_line.py)
    # the GPU's dense BF16 peak in TFLOP/s for the MFU column; null: looked up by device name
    # (train/logs/log_line.py's table), no MFU on CPU or a GPU it lacks
    peak_tflops: float | None = None
    tensorboard: bool = False  # also write the logged scalars to <run dir>/tensorboard
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass(kw_only=True)
class CheckpointConfig:
    """Megatron dist_checkpointing, saved atomically (see train/checkpoint.py)."""

    dir: str | None = None  # None: <run dir>/checkpoints; a checkpoint there is resumed
    interval: int = 0  # steps between saves; 0: only at the end and on SIGTERM/SIGUSR1/SIGINT
    save_at_end: bool = True
    resume: bool = True  # false: refuse to start if the dir already holds checkpoints
    keep: int = 2  # newest checkpoints kept (by step); older ones are deleted; <= 0: keep all
    # distributed optimizer state in Megatron's fully_reshardable form (resumable at another
    # TP; gathers the state over DP at save) instead of dp_reshardable (only DP may change)
    optim_fully_reshardable: bool = False
    # a sha256 manifest with every checkpoint (each rank hashes the files it wrote), checked
    # before a resume loads it; false: neither written nor checked (train/trust.py)
    checksums: bool = True


@dataclass(kw_only=True)
class Config:
    experiment: str = "default"  # W&B group and the run dir's parent
    model: ModelConfig = MISSING
    precision: PrecisionConfig = MISSING
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def register_configs() -> None:
    """Registers the schema as `base_config`, the first entry of ufp4_megatron/configs/config.yaml,
    and the resolver of its preset defaults."""
    register_preset_resolver()
    register_ablation_resolver()
    ConfigStore.instance().store(name="base_config", node=Config)
