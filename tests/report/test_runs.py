"""Which RUN argument is what (report/runs.py), in process.

test_partial_last_metrics_line_is_skipped   a run killed mid-write still compares
test_missing_path_names_the_nearest_dir     typo -> "no such run dir" with close names
test_wandb_path_only_when_nothing_local     a/b/c with a local a/ is a typo, not an API call
test_offline_wandb_run_reads_as_the_run_dir
"""

import json

import pytest
from _runs import write_run

from ufp4_megatron.report.errors import BadInput
from ufp4_megatron.report.runs import load_run


def test_partial_last_metrics_line_is_skipped(tmp_path, capsys):
    run = write_run(tmp_path / "u", "ufp4", 1, [3.0, 2.0, 1.5])
    with open(f"{run}/metrics.jsonl", "a") as f:
        f.write('{"step": 4, "loss": 1.')
    assert load_run(run).loss == {1: 3.0, 2: 2.0, 3: 1.5}
    assert "skipped a partial last line" in capsys.readouterr().out


def test_missing_path_names_the_nearest_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "runs" / "exp" / "tiny-ufp4-s1234", "ufp4", 1234, [2.0])
    with pytest.raises(
        BadInput,
        match=r"^no such run dir: runs/exp/tiny-ufp4-s123 \(in "
        r"runs/exp: did you mean tiny-ufp4-s1234\?\)$",
    ):
        load_run("runs/exp/tiny-ufp4-s123")
    with pytest.raises(
        BadInput,
        match=r"^no such run dir: runs/exq/x \(in runs: did you mean "
        r"exp\?\)$",
    ):
        load_run("runs/exq/x")


def test_wandb_path_only_when_nothing_local(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "team").mkdir()
    with pytest.raises(BadInput, match="^no such run dir: team/proj/abc$"):
        load_run("team/proj/abc")  # team/ is local: a mistyped path


def test_offline_wandb_run_reads_as_the_run_dir(tmp_path):
    import wandb

    wb = wandb.init(
        project="t",
        mode="offline",
        dir=str(tmp_path),
        config={"model": {"name": "tiny"}, "precision": {"name": "e2m1"}, "train": {"seed": 5}},
        settings=wandb.Settings(quiet=True),
    )
    for step, loss in ((1, 3.0), (2, 2.5)):
        wb.log({"loss": loss, "tokens": 64 * step}, step=step)
    wb.finish()
    wandb.teardown()  # the run file is complete once W&B's service has stopped
    run = load_run(str(tmp_path / "wandb"))
    assert (run.model, run.recipe, run.seed, run.loss) == ("tiny", "e2m1", 5, {1: 3.0, 2: 2.5})
    assert run.tokens == {1: 64, 2: 128} and "_wandb" not in run.config
    assert json.dumps(run.config)  # plain containers


def test_hydra_copy_resolves_preset_switches(tmp_path):
    """A run dir with only Hydra's (unresolved) copy of the config: its rht/sr switches are
    `${ufp4.preset:...}` strings there (train/schema.py) and must read as the preset's values,
    not as strings; an interpolation nothing can resolve is a clear error."""
    run = tmp_path / "r"
    write_run(run, "ufp4", 1, [3.0, 2.0])
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text(
        "experiment: t\nmodel: {name: tiny}\ntrain: {seed: 1, global_batch: 2, seq_len: 32}\n"
        "precision: {name: ufp4, recipe: ufp4,\n"
        "  rht: {fprop: '${ufp4.preset:${..recipe},rht.fprop}'}}\n"
    )
    (run / "config.yaml").unlink()
    assert load_run(str(run)).config["precision"]["rht"]["fprop"] is True
    (run / ".hydra" / "config.yaml").write_text("model: {name: '${other.tool:x}'}\n")
    with pytest.raises(BadInput, match="cannot resolve"):
        load_run(str(run))
