"""A run is what its command says: the run dir and W&B id follow the run's identity, and a
resume is checked against the config stored in the run dir before anything is written.

    test_run_id_is_the_same_from_dictconfig_dataclass_and_stored_yaml
    test_run_id_changes_with_identity_keys_only     ablations, seed, data vs steps, layout
    test_identity_keys_are_known                an identity key added without an entry in
        identity.KEYS_ADDED_LATER would rename every earlier run
    test_a_key_added_later_renames_no_run       at the earlier value it is left out (a stored
        config without it has the same run_id); the study's own archives pair across it
    test_hydra_run_and_sweep_dirs_carry_the_run_id
    test_wandb_id_follows_the_run_dir
    test_ablations_get_their_own_dirs_and_resumes_are_checked   (real CLI, default dirs):
        a multirun over precision.rht.fprop=true,false gives two dirs; the plain command then
        finds its dir complete and touches nothing; train.steps extended resumes and is
        recorded; precision=e2m1 into the ufp4 dir is refused, nothing rewritten; a checkpoint
        without its config.yaml is refused
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _cli import FAST, run
from hydra import compose
from omegaconf import OmegaConf

from ufp4_megatron.train.logs.wandb_run import wandb_id
from ufp4_megatron.train.rundir import identity

pytestmark = pytest.mark.usefixtures("hydra_configs")  # tests/conftest.py


def compose_cfg(*overrides: str, hydra: bool = False):
    return compose("config", overrides=["model=tiny", *overrides], return_hydra_config=hydra)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["precision=e2m1", "train.seed=7"],
        ["+precision.overrides.fprop.x.grid=e2m1", "data.prefixes=[a,b]", "optim.lr=1"],
    ],
)
def test_run_id_is_the_same_from_dictconfig_dataclass_and_stored_yaml(overrides):
    d = compose_cfg(*overrides)
    stored = OmegaConf.to_container(OmegaConf.create(OmegaConf.to_yaml(d, resolve=True)))
    ids = {identity.run_id(d), identity.run_id(OmegaConf.to_object(d)), identity.run_id(stored)}
    assert len(ids) == 1 and len(ids.pop()) == 8


def test_run_id_changes_with_identity_keys_only():
    base = identity.run_id(compose_cfg())
    others = [
        "precision.rht.fprop=false",
        "precision=e2m1",
        "precision.sr.dy=false",
        "train.seed=1",
        "train.seq_len=512",
        "train.global_batch=16",
        "optim.lr=1e-3",
        "model.num_layers=3",
        "data.corpus_max_bytes=1000",
        "precision.name=x",
    ]
    ids = [identity.run_id(compose_cfg(o)) for o in others]
    assert base not in ids and len(set(ids)) == len(ids)
    same = [
        "train.steps=5",
        "train.micro_batch=4",
        "train.eval_interval=3",
        "logging.log_interval=5",
        "parallel.tp=2",
        "checkpoint.interval=7",
        "data.cache_dir=/elsewhere",
        "data.valid_seed=7",
        "experiment=other",
        "train.device=cpu",
    ]
    assert {identity.run_id(compose_cfg(o)) for o in same} == {base}
    # the BF16 reference and the 4-bit runs of one model/data/seed are siblings
    assert identity.sibling_key(compose_cfg("precision=bf16")) == identity.sibling_key(
        compose_cfg("precision.rht.fprop=false")
    )
    assert identity.differences(compose_cfg(), compose_cfg("precision=e2m1")) == [
        "precision.name",
        "precision.recipe",
        "precision.rht.dgrad",
        "precision.rht.fprop",
    ]


# The identity's keys, group.key: a key added to an identity group renames every run recorded
# before it unless identity.KEYS_ADDED_LATER names it with the value those runs trained with.
IDENTITY_KEYS = frozenset(
    [
        "data.corpus_bpe_vocab",
        "data.corpus_max_bytes",
        "data.prefixes",
        "data.split",
        "data.tokenizer",
        "model.attention_backend",
        "model.cpu_init",
        "model.cross_entropy_fusion",
        "model.ffn_hidden_size",
        "model.hidden_size",
        "model.init_std",
        "model.kv_channels",
        "model.max_seq_len",
        "model.moe_aux_loss_coeff",
        "model.moe_capacity_factor",
        "model.moe_ffn_hidden_size",
        "model.moe_first_dense",
        "model.moe_pad_to_capacity",
        "model.moe_grouped_gemm",
        "model.moe_router_topk",
        "model.moe_shared_expert_size",
        "model.name",
        "model.num_attention_heads",
        "model.num_experts",
        "model.num_layers",
        "model.num_query_groups",
        "model.rotary_base",
        "model.sdpa_kernels",
        "model.transformer_impl",
        "model.untie_embeddings",
        "model.vocab_size",
        "optim.adam_kernel",
        "optim.beta1",
        "optim.beta2",
        "optim.clip_grad",
        "optim.decay_steps",
        "optim.decay_style",
        "optim.eps",
        "optim.lr",
        "optim.min_lr",
        "optim.warmup_steps",
        "optim.weight_decay",
        "optim.wsd_decay_steps",
        "optim.wsd_decay_style",
        "precision.bf16_layers",
        "precision.block",
        "precision.block_2d",
        "precision.grid",
        "precision.name",
        "precision.overrides",
        "precision.recipe",
        "precision.rht",
        "precision.scale",
        "precision.sr",
        "train.dtype",
        "train.global_batch",
        "train.seed",
        "train.seq_len",
    ]
)


def test_identity_keys_are_known():
    cfg = OmegaConf.to_container(compose_cfg(), resolve=True)
    keys = {
        f"{g}.{k}"
        for g in (*identity.IDENTITY_GROUPS, "train")
        for k in cfg[g]
        if (g, k) not in identity.NON_IDENTITY_KEYS
        and (g != "train" or k in identity.IDENTITY_TRAIN_KEYS)
    }
    added, removed = sorted(keys - IDENTITY_KEYS), sorted(IDENTITY_KEYS - keys)
    assert not added, (
        f"new identity keys {added}: name each in identity.KEYS_ADDED_LATER "
        "with the value earlier runs trained with, then add it to IDENTITY_KEYS"
    )
    assert not removed, f"identity keys gone: {removed}; every stored config holds them"
    later = {f"{g}.{k}" for g, k in identity.KEYS_ADDED_LATER}
    assert later <= IDENTITY_KEYS


def test_a_key_added_later_renames_no_run():
    for (group, key), earlier in identity.KEYS_ADDED_LATER.items():
        value = "null" if earlier is None else earlier  # Hydra's spelling of None
        now = OmegaConf.to_container(compose_cfg(f"{group}.{key}={value}"), resolve=True)
        before = {g: (dict(n) if isinstance(n, dict) else n) for g, n in now.items()}
        del before[group][key]  # a config.yaml stored before the key existed
        assert identity.run_id(before) == identity.run_id(now)
        assert identity.sibling_key(before) == identity.sibling_key(now)
        assert identity.differences(before, now) == []
        changed = 1.0 if earlier is None else not earlier  # another value of the key's type
        other = OmegaConf.to_container(compose_cfg(f"{group}.{key}={changed}"), resolve=True)
        assert identity.run_id(other) != identity.run_id(now)  # any other value: another run


def test_the_study_archives_pair_across_a_key_added_later(tmp_path):
    """The real recorded configs of the pysrc study's archives: e2m1_uniform-s4 (recorded with
    model.cross_entropy_fusion=false) against bf16-s4 (recorded before the key existed)."""
    import tarfile

    import yaml

    archives = sorted(
        (Path(__file__).parents[2] / "docs/results/study-pysrc").glob("round*.tar.gz")
    )
    found = {}
    for a in archives:
        with tarfile.open(a) as t:
            for m in t.getmembers():
                for run in ("bf16-s4", "e2m1_uniform-s4"):
                    if m.name == f"runs/{run}/config.yaml":
                        found[run] = yaml.safe_load(t.extractfile(m))
    new, old = found["e2m1_uniform-s4"], found["bf16-s4"]
    assert "cross_entropy_fusion" in new["model"] and "cross_entropy_fusion" not in old["model"]
    assert identity.sibling_key(new) == identity.sibling_key(old)


def test_hydra_run_and_sweep_dirs_carry_the_run_id():
    for overrides, label in (
        ([], "ufp4"),
        (["precision.rht.fprop=false", "experiment=abl"], "ufp4-rht.fprop=false"),
    ):  # an ablation's name
        cfg = compose_cfg(*overrides, hydra=True)
        name = f"tiny-{label}-s1234-{identity.run_id(cfg)}"
        assert OmegaConf.select(cfg, "hydra.run.dir") == f"runs/{cfg.experiment}/{name}"
        assert OmegaConf.select(cfg, "hydra.sweep.subdir") == name
        assert OmegaConf.select(cfg, "hydra.sweep.dir") == f"runs/{cfg.experiment}"


def test_wandb_id_follows_the_run_dir(tmp_path):
    a = OmegaConf.to_object(compose_cfg())
    b = OmegaConf.to_object(compose_cfg("precision.rht.fprop=false"))
    assert wandb_id(a, tmp_path / "x") == wandb_id(
        OmegaConf.to_object(compose_cfg()), tmp_path / "x"
    )
    assert wandb_id(a, tmp_path / "x").startswith(identity.run_id(a) + "-")
    assert (
        len({wandb_id(a, tmp_path / "x"), wandb_id(a, tmp_path / "y"), wandb_id(b, tmp_path / "x")})
        == 3
    )


# ---- the real CLI, in default (identity-named) run dirs under a temporary working dir ----


def _train(tmp: Path, *overrides: str, flags: tuple[str, ...] = ()):
    cmd = [
        sys.executable,
        "-m",
        "ufp4_megatron.train",
        *flags,
        *FAST,
        "logging.wandb.mode=disabled",
        f"data.cache_dir={tmp / 'cache'}",
        *overrides,
    ]
    return run(cmd, tmp, cwd=tmp / "work")


def _snapshot(run_dir: Path) -> dict:
    return {
        p.relative_to(run_dir).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in run_dir.rglob("*")
        if p.is_file()
    }


def _dirs(tmp: Path) -> dict[bool, Path]:
    """{precision.rht.fprop: run dir} of the runs under runs/default."""
    out = {}
    for d in (tmp / "work" / "runs" / "default").iterdir():
        if (d / "config.yaml").is_file():
            fprop = OmegaConf.load(d / "config.yaml").precision.rht.fprop
            out[fprop] = d
    return out


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ablations_and_resumes_are_checked(tmp_path):
    (tmp_path / "work").mkdir()
    r = _train(
        tmp_path,
        "precision.rht.fprop=true,false",
        "train.steps=2",
        "~hydra/callbacks",
        flags=("-m",),
    )  # (no BF16 run to compare against: the compare callback off)
    assert r.returncode == 0, r.stderr[-3000:]
    dirs = _dirs(tmp_path)
    assert set(dirs) == {True, False} and dirs[True] != dirs[False]
    # the ablation's dir is named after its change (train/precision_resolvers.py)
    assert dirs[True].name.startswith("tiny-ufp4-s1234-")
    assert dirs[False].name.startswith("tiny-ufp4-rht.fprop=false-s1234-")
    for d in dirs.values():
        assert [x["step"] for x in _lines(d / "metrics.jsonl")] == [1, 2]
        assert (d / ".hydra" / "overrides.yaml").exists()

    # the plain command is the fprop=true member of the sweep: complete, nothing touched
    before = {k: _snapshot(d) for k, d in dirs.items()}
    r = _train(tmp_path, "precision=ufp4", "train.steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"already complete at step 2: nothing to do ({dirs[True]})" in r.stdout
    assert {k: _snapshot(d) for k, d in dirs.items()} == before
    assert _dirs(tmp_path) == dirs

    # a longer schedule (and another micro-batch) continues it, and says and records so
    r = _train(tmp_path, "train.steps=3", "train.micro_batch=1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming from step 2 of 3 in {dirs[True]}" in r.stdout
    assert [x["step"] for x in _lines(dirs[True] / "metrics.jsonl")] == [1, 2, 3]
    (entry,) = _lines(dirs[True] / "resumes.jsonl")
    assert entry["step"] == 2 and entry["steps"] == 3
    assert entry["changes"] == {"train.steps": [2, 3], "train.micro_batch": [2, 1]}
    assert OmegaConf.load(dirs[True] / "config.yaml").train.steps == 3
    assert _snapshot(dirs[False]) == before[False]

    # another recipe pointed at the ufp4 dir: refused, naming the keys; nothing rewritten
    kept = _snapshot(dirs[True])
    r = _train(tmp_path, "precision=e2m1", "train.steps=3", f"hydra.run.dir={dirs[True]}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (
        f"error: {dirs[True]} holds another run: its config.yaml differs in "
        "precision.name, precision.recipe, precision.rht.dgrad, precision.rht.fprop. "
        "To start a fresh run"
    ) in r.stderr
    assert _snapshot(dirs[True]) == kept

    # a checkpoint whose config.yaml is gone cannot be checked: refused
    (dirs[False] / "config.yaml").unlink()
    r = _train(tmp_path, "precision.rht.fprop=false", "train.steps=3")
    assert r.returncode == 2
    assert "the config it was trained with, is missing" in r.stderr
    assert [x["step"] for x in _lines(dirs[False] / "metrics.jsonl")] == [1, 2]


def test_a_start_refused_for_its_data_pins_nothing(tmp_path):
    """Data the trainer's checks refuse: one `error:` line, exit 2; the same dir then takes
    the corrected command (nothing was trained there, so there is no other run to protect)."""
    (tmp_path / "work").mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "d.bin").write_bytes(b"x")
    (bad / "d.idx").write_bytes(b"not an index")
    run_dir = tmp_path / "work" / "run"
    r = _train(
        tmp_path, f"data.prefixes=[{bad / 'd'}]", "train.steps=1", f"hydra.run.dir={run_dir}"
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"error: {bad / 'd'}.idx is not a readable Megatron index" in r.stderr
    assert not (run_dir / "metrics.jsonl").exists()
    r = _train(tmp_path, "train.steps=1", f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"starting {run_dir} (train.steps=1)" in r.stdout
