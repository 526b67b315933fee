"""What Megatron-LM's pretrain_gpt.py does up to its model, on CPU, in one process per call.

    python probe.py routes CASES.json    (cwd / PYTHONPATH: a Megatron-LM root, see conftest)
    python probe.py validate CASES.json  argument parsing and validation only
    python probe.py te                   TE-shaped spec rewrite, built into a model
    python probe.py sr_state             the SR stream in Megatron's checkpoint extra state
    python probe.py load_converted CASE.json  load a converted checkpoint as load_checkpoint does
    python probe.py save_megatron_lm CASE.json  a checkpoint as save_checkpoint writes it

`routes` runs, for each case {name, argv, env}, the steps of pretrain_gpt.py's __main__ and of
pretrain()'s model setup: parse_and_validate_args (with pretrain_gpt.py's args_defaults),
gpt_config_from_args, pretrain_cfg_container_from_args, then the builder class of the model
config (GPTModelBuilder) and its build_model, which is what build_distributed_models calls
per pipeline stage. It reports the stage that failed with its message, or every parallel
linear of the built model with its class and recipe. Prints one line `PROBE_JSON {...}`.

Test harness only. Two shims, both outside Megatron's code: megatron/training uses
`typing.override` (Python 3.12), so on 3.11 typing gets typing_extensions' (the same
function); and the plugin's cpu_compat stands in for CUDA (a no-op on a GPU machine).
"""

import contextlib
import io
import json
import os
import sys
import typing
import warnings

if sys.version_info < (3, 12):
    import typing_extensions

    typing.override = typing_extensions.override
warnings.filterwarnings("ignore")

import torch  # noqa: E402


def _init_world() -> None:
    from megatron.core import parallel_state as ps

    from ufp4_megatron.megatron import enable_cpu_compat
    from ufp4_megatron.train.distributed import single_process_group

    enable_cpu_compat()
    single_process_group("gloo")  # the trainer's: no port, fails at once without a network
    ps.initialize_model_parallel()


def _linears(model) -> dict:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    out = {}
    for name, m in model.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) or hasattr(m, "ufp4"):
            binding = getattr(m, "ufp4", None)
            out[name] = [
                type(m).__name__,
                None if binding is None else binding.recipe.name,
                None if binding is None else binding.recipe.describe(),
            ]
    return out


def _step(model, seq: int = 32) -> float:
    """One forward/backward of a tiny GPT on random tokens (explicit causal mask: Megatron's
    default one is allocated on CUDA)."""
    tokens = torch.randint(0, 128, (2, seq))
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)[None, None]
    loss = model(tokens, torch.arange(seq).expand(2, seq), mask, labels=tokens).float().mean()
    loss.backward()
    return loss.item()


# ----------------------------------------------------------------------------- routes


def routes(cases: list[dict]) -> dict:
    import megatron.core
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.training.argument_utils import (
        gpt_config_from_args,
        pretrain_cfg_container_from_args,
    )
    from megatron.training.global_vars import unset_global_variables

    from ufp4_megatron.megatron import seed_model_parallel

    pretrain_gpt = None
    if os.path.exists("pretrain_gpt.py"):  # a Megatron-LM checkout, not the wheel
        sys.path.insert(0, os.getcwd())
        import pretrain_gpt
    _init_world()
    out = {
        "_meta": {
            "megatron_core": megatron.core.__version__,
            "megatron_core_file": megatron.core.__file__,
            "pretrain_gpt": pretrain_gpt is not None,
        }
    }
    for case in cases:
        out[case["name"]] = _route(
            case,
            gpt_config_from_args,
            pretrain_cfg_container_from_args,
            seed_model_parallel,
            ProcessGroupCollection,
        )
        unset_global_variables()
    return out


def _route(
    case, gpt_config_from_args, container_from_args, seed_model_parallel, ProcessGroupCollection
) -> dict:
    """parse_and_validate_args, step by step (to tell parsing from validation errors)."""
    saved_env = dict(os.environ)
    os.environ.update(case.get("env", {}))
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    stage, result = "parse", {}
    try:
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                from megatron.training.arguments import parse_args, validate_args

                args = parse_args()
            except SystemExit as e:
                return {
                    "stage": "parse",
                    "error": f"SystemExit({e.code}): " + err.getvalue().strip().splitlines()[-1],
                }
            stage = "validate"
            validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
            from megatron.training.global_vars import set_global_variables

            set_global_variables(args)  # the rest of parse_and_validate_args
            stage = "config"
            if case.get("hybrid"):  # pretrain_hybrid.py's config step instead
                from megatron.training.argument_utils import hybrid_config_from_args

                hybrid_config_from_args(args)
                return {"stage": "ok"}
            model_cfg = gpt_config_from_args(args)
            full = container_from_args(args, model_cfg)
        result["args"] = {
            "fp4": args.fp4,
            "fp4_recipe": args.fp4_recipe,
            "ufp4_format": getattr(args, "ufp4_format", None),
        }
        result["config_fp4"] = full.model.transformer.fp4
        spec = full.model.transformer_layer_spec
        result["spec"] = None if spec is None else getattr(spec, "__name__", None) or repr(spec)
        if not case.get("build", True):
            return {"stage": "ok", **result}
        stage = "build"
        seed_model_parallel(args.seed)
        builder = full.model.get_builder_cls()(full.model)
        model = builder.build_model(ProcessGroupCollection.use_mpu_process_groups())
        result["builder"] = type(builder).__name__
        result["linears"] = _linears(model)
        result["ufp4"] = sum(1 for v in result["linears"].values() if v[1] is not None)
        return {"stage": "ok", **result}
    except (ValueError, AssertionError, TypeError, ImportError) as e:
        return {"stage": stage, "error": f"{type(e).__name__}: {e}", **result}
    finally:
        os.environ.clear()
        os.environ.update(saved_env)


def validate(cases: list[dict]) -> dict:
    """parse_args + validate_args only, without importing the plugin first (so a case can
    run with the plugin shadowed on PYTHONPATH)."""
    from megatron.training.arguments import parse_args, validate_args

    out = {}
    for case in cases:
        sys.argv = ["pretrain_gpt.py", *case["argv"]]
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                validate_args(parse_args(), {"tokenizer_type": "GPT2BPETokenizer"})
            out[case["name"]] = {"stage": "ok"}
        except ValueError as e:
            out[case["name"]] = {"stage": "validate", "error": str(e)}
    return out


# ----------------------------------------------------------------------------- te


def te() -> dict:
    """Megatron's TE layer structure built from stand-in classes (te_standins.py), rewritten,
    built into a GPT, run forward/backward, and its checkpoint keys listed."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig
    from te_standins import TE_CLASSES, te_layer

    from ufp4_megatron.megatron import UFP4Policy, seed_model_parallel
    from ufp4_megatron.megatron.spec import ufp4_block_spec

    _init_world()
    out = {}
    for label, experts in (("dense", None), ("moe", 4)):
        kw = (
            dict(
                num_moe_experts=experts,
                moe_router_topk=2,
                moe_token_dispatcher_type="allgather",
                add_bias_linear=False,
            )
            if experts
            else {}
        )
        config = TransformerConfig(
            num_layers=3,
            hidden_size=64,
            num_attention_heads=4,
            normalization="RMSNorm",
            use_cpu_initialization=True,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            **kw,
        )
        models = {}
        for recipe in ("bf16", "ufp4"):
            # layer 0 stays BF16 (TE's modules), layers 1-2 run the recipe
            policy = UFP4Policy(recipe, rules={"decoder.layers.0.*": "bf16"})
            block = ufp4_block_spec(te_layer(experts), config, policy, te=TE_CLASSES)
            seed_model_parallel(1)
            model = GPTModel(
                config=config, transformer_layer_spec=block, vocab_size=128, max_sequence_length=32
            )
            loss = _step(model)
            sharded = model.sharded_state_dict()
            models[recipe] = {
                "linears": _linears(model),
                "norms": {
                    n: type(m).__name__
                    for n, m in model.named_modules()
                    if n.endswith(("input_layernorm", "pre_mlp_layernorm"))
                },
                "keys": sorted(
                    (v.key, tuple(v.global_shape), tuple(v.global_offset))
                    for v in sharded.values()
                    if not v.key.endswith("_extra_state")
                ),
                "loss": loss,
            }
        out[label] = models
    return out


# ----------------------------------------------------------------------------- sr_state


def sr_state() -> dict:
    """The SR stream through Megatron's checkpoint path: sharded_state_dict's ShardedObjects
    and load_state_dict (what Megatron-LM's load_checkpoint calls after reading them)."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, is_main_replica
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from ufp4_megatron.megatron import UFP4Policy, seed_model_parallel
    from ufp4_megatron.megatron.spec import ufp4_block_spec

    _init_world()
    config = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )

    def build(recipe):
        policy = UFP4Policy(recipe, sr_seed=7)
        spec = ufp4_block_spec(get_gpt_layer_local_spec(), config, policy)
        seed_model_parallel(1)
        return GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=128, max_sequence_length=32
        ), policy

    model, policy = build("ufp4")
    _step(model)
    _step(model)
    objects = {k: v for k, v in model.sharded_state_dict().items() if isinstance(v, ShardedObject)}
    ufp4_objects = {k: v for k, v in objects.items() if isinstance(v.data, dict)}
    buf = io.BytesIO()
    torch.save({k: v.data for k, v in ufp4_objects.items()}, buf)
    buf.seek(0)
    reloaded = torch.load(buf, weights_only=True)  # how Megatron reads checkpoint objects
    state = model.state_dict()
    draws_at_save = policy.seeds.draws
    after_save = [policy.seeds.draw(1, 2, 3, 0) for _ in range(3)]

    fresh, fresh_policy = build("ufp4")
    fresh.load_state_dict(state)
    resumed = [fresh_policy.seeds.draw(1, 2, 3, 0) for _ in range(3)]

    bf16, _ = build("bf16")
    other, other_policy = build("ufp4")
    missing = other.load_state_dict(bf16.state_dict(), strict=True)
    bf16.load_state_dict(state, strict=True)  # a UFP4 checkpoint into Megatron's own linears
    return {
        "objects": sorted(objects),
        "ufp4_objects": {
            k: {
                "key": v.key,
                "main_replica": is_main_replica(v.replica_id),
                "draws": v.data["ufp4_sr_seeds"]["draws"],
            }
            for k, v in ufp4_objects.items()
        },
        "reloaded_draws": sorted({v["ufp4_sr_seeds"]["draws"] for v in reloaded.values()}),
        "draws_at_save": draws_at_save,
        "fresh_draws": fresh_policy.seeds.draws - 3,
        "after_save": after_save,
        "resumed": resumed,
        "bf16_into_ufp4_draws": other_policy.seeds.draws,
        "bf16_into_ufp4_missing": [list(missing.missing_keys), list(missing.unexpected_keys)],
    }


# ----------------------------------------------------------------------------- load_converted


def load_converted(case: dict) -> dict:
    """Megatron-LM's load_checkpoint (megatron/training/checkpointing.py) on CPU, step by step,
    for case {argv, env, load}: the tracker read by read_metadata, the iter dir by
    get_checkpoint_name, the format by _get_checkpoint_format, the common state, the args
    check, the content metadata, the sharded state dict by generate_state_dict for the model
    pretrain_gpt.py builds from `argv`, dist_checkpointing.load with Megatron-LM's strictness,
    and the model's strict load_state_dict. Skipped: the optimizer (Megatron's needs CUDA
    here) and the RNG (torch.cuda.set_rng_state). Reports each stage, or where it failed."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistLoadShardedStrategy
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.training import checkpointing as ck
    from megatron.training.argument_utils import (
        gpt_config_from_args,
        pretrain_cfg_container_from_args,
    )
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.global_vars import set_global_variables

    from ufp4_megatron.megatron import seed_model_parallel

    os.environ.update(case.get("env", {}))
    load = case["load"]
    out = {}
    stage = "tracker"
    try:
        # before the process group, as a tool that edits checkpoints reads it
        iteration, release = ck.read_metadata(ck.get_checkpoint_tracker_filename(load))
        name = ck.get_checkpoint_name(load, iteration, release, return_base_dir=True)
        out |= {"iteration": iteration, "release": release, "dir": os.path.basename(name)}
        _init_world()
        sys.argv = ["pretrain_gpt.py", *case["argv"], "--load", load]
        with contextlib.redirect_stdout(io.StringIO()):
            args = parse_args()
            validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
            set_global_variables(args)
        stage = "format"
        out["format"] = ck._get_checkpoint_format(name, args)
        stage = "common"
        common = dist_checkpointing.load_common_state_dict(name)
        out["common_keys"] = sorted(common)
        ckpt_args = common["args"]
        out["consumed_train_samples"] = ckpt_args.consumed_train_samples
        out["no_save_rng"] = ckpt_args.no_save_rng
        out["opt_param_scheduler"] = common.get("opt_param_scheduler")
        stage = "args"
        ck.set_checkpoint_version(common.get("checkpoint_version", 0))
        ck.check_checkpoint_args(ckpt_args)
        stage = "build"
        seed_model_parallel(args.seed)
        full = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
        model = full.model.get_builder_cls()(full.model).build_model(
            ProcessGroupCollection.use_mpu_process_groups()
        )
        stage = "load"
        md = dist_checkpointing.load_content_metadata(preloaded_state_dict=common) or {}
        md["dp_cp_group"] = __import__(
            "megatron.core.parallel_state", fromlist=["x"]
        ).get_data_parallel_group(with_context_parallel=True)
        sharded = ck.generate_state_dict(
            args, [model], None, None, None, model_sd_kwargs=dict(metadata=md)
        )
        state = dist_checkpointing.load(
            sharded, name, TorchDistLoadShardedStrategy(), strict=args.dist_ckpt_strictness
        )
        result = model.load_state_dict(state["model"], strict=True)
        out["missing"] = list(result.missing_keys) if result else []
        out["iteration_in_state"] = state["iteration"]
        out["weights"] = {
            k: float(v.detach().double().sum())
            for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")
        }
        out["model_sum"] = sum(out["weights"].values())
        if case.get("source"):  # the trainer's step dir it was converted from
            plain = dist_checkpointing.load_plain_tensors(case["source"])
            out["source_sum"] = sum(
                float(v.double().sum())
                for k, v in plain.items()
                if isinstance(v, torch.Tensor) and not k.startswith("optimizer.")
            )
        streams = {
            repr(m.ufp4.seeds.state_dict()["draws"]) for m in model.modules() if hasattr(m, "ufp4")
        }
        out["sr_draws"] = sorted(streams)
        return {"stage": "ok", **out}
    except (ValueError, AssertionError, TypeError, KeyError, RuntimeError, Exception) as e:
        return {"stage": stage, "error": f"{type(e).__name__}: {str(e)[:500]}", **out}


def _pretrain_gpt_model(argv: list[str]):
    """args and the model pretrain_gpt.py builds from `argv` (after _init_world)."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.training.argument_utils import (
        gpt_config_from_args,
        pretrain_cfg_container_from_args,
    )
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.global_vars import set_global_variables

    from ufp4_megatron.megatron import seed_model_parallel

    sys.argv = ["pretrain_gpt.py", *argv]
    with contextlib.redirect_stdout(io.StringIO()):
        args = parse_args()
        validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        set_global_variables(args)
    seed_model_parallel(args.seed)
    full = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
    model = full.model.get_builder_cls()(full.model).build_model(
        ProcessGroupCollection.use_mpu_process_groups()
    )
    return args, model


def save_megatron_lm(case: dict) -> dict:
    """A checkpoint at case["save"] as Megatron-LM's save_checkpoint (torch_dist) writes it,
    for the model pretrain_gpt.py builds from case["argv"], after case["iterations"] training
    iterations on random tokens: Megatron-Core's DDP and get_megatron_optimizer, Megatron's
    OptimizerParamScheduler counting samples as training.py does, args.consumed_train_samples,
    generate_state_dict, _build_sharded_state_dict_metadata, dist_checkpointing.save with the
    content metadata, and the tracker file. The RNG state is the dict get_rng_state builds,
    without its CUDA generator (none on CPU)."""
    import random

    import numpy as np
    from megatron.core import dist_checkpointing, tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.training import checkpointing as ck

    os.environ.update(case.get("env", {}))
    _init_world()
    args, model = _pretrain_gpt_model(case["argv"])
    ddp = DistributedDataParallel(
        config=model.config,
        module=model,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=args.use_distributed_optimizer
        ),
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=args.lr,
            min_lr=args.min_lr,
            weight_decay=args.weight_decay,
            adam_beta1=args.adam_beta1,
            adam_beta2=args.adam_beta2,
            adam_eps=args.adam_eps,
            clip_grad=args.clip_grad,
            bf16=args.bf16,
            params_dtype=args.params_dtype,
            use_distributed_optimizer=args.use_distributed_optimizer,
        ),
        [ddp],
    )
    batch = args.global_batch_size
    sched = OptimizerParamScheduler(
        opt,
        init_lr=0.0,
        max_lr=args.lr,
        min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters * batch,
        lr_decay_steps=args.train_iters * batch,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.weight_decay,
        end_wd=args.weight_decay,
        wd_incr_steps=args.train_iters * batch,
        wd_incr_style="constant",
    )
    for _ in range(case["iterations"]):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        _step(ddp.module)
        opt.step()
        sched.step(increment=batch)
    iteration = case["iterations"]
    args.consumed_train_samples = iteration * batch
    rng = ShardedObject(
        "rng_state",
        [
            {
                "random_rng_state": random.getstate(),
                "np_rng_state": np.random.get_state(),
                "torch_rng_state": torch.get_rng_state(),
                "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
            }
        ],
        (1, 1),
        (0, 0),
        replica_id=0,
    )
    md = ck._build_sharded_state_dict_metadata(args)
    state = ck.generate_state_dict(
        args,
        [model],
        opt,
        sched,
        rng,
        iteration=iteration,
        optim_sd_kwargs=dict(metadata=md),
        model_sd_kwargs=dict(metadata=md),
    )
    state["num_floating_point_operations_so_far"] = 0
    name = ck.get_checkpoint_name(case["save"], iteration, return_base_dir=True)
    os.makedirs(name)
    dist_checkpointing.save(state, name, content_metadata=ck._clean_metadata_for_serialization(md))
    with open(ck.get_checkpoint_tracker_filename(case["save"]), "w") as f:
        f.write(str(iteration))
    return {
        "stage": "ok",
        "dir": name,
        "weights_sum": sum(
            float(v.detach().double().sum())
            for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")
        ),
    }


def _main() -> dict:
    kind = sys.argv[1]
    if kind in ("load_converted", "save_megatron_lm"):
        with open(sys.argv[2]) as f:
            case = json.load(f)
        return load_converted(case) if kind == "load_converted" else save_megatron_lm(case)
    if kind in ("routes", "validate"):
        with open(sys.argv[2]) as f:
            return {"routes": routes, "validate": validate}[kind](json.load(f))
    return {"te": te, "sr_state": sr_state}[kind]()


if __name__ == "__main__":
    try:
        from ufp4_megatron.train.validate import ConfigError
    except ImportError:  # the no-plugin route shadows the package: nothing raises it then

        class ConfigError(Exception):
            pass

    try:
        result = _main()
    except ConfigError as e:  # this machine cannot run the probe (e.g. no network interface)
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    print("PROBE_JSON " + json.dumps(result))
