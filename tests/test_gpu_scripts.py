"""The GPU suites under gpu/ (and the benchmark code they drive) run as a user's runs would:
every GPU measurement keeps checkpointing on (a script that turned it off to pass would hide
a broken checkpoint path), so no script may switch the trainer's saving off. Checked on the
scripts' text, since they only run on a GPU. Their refusals of bad settings, gpu/setup.sh's
install and the helpers they share are exercised with stand-ins for python3 and nvidia-smi."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the overrides that would make a GPU run save nothing
OFF = re.compile(r"checkpoint\.(save_at_end=false|interval=0\b|resume=false)")


def test_no_gpu_script_switches_checkpointing_off():
    # gpu/'s scripts and the benchmark code they drive (ufp4_megatron/bench: the step table)
    scripts = sorted(
        p
        for d in ("gpu", "ufp4_megatron/bench")
        for p in (ROOT / d).rglob("*")
        if p.suffix in (".sh", ".py")
    )
    assert scripts, "gpu/ holds no scripts: this test looks in the wrong place"
    offenders = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in scripts
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if OFF.search(line)
    ]
    assert not offenders, "GPU scripts that switch checkpointing off:\n" + "\n".join(offenders)


def test_the_check_sees_an_offending_line():
    assert OFF.search('run_trainer(name, ["checkpoint.save_at_end=false", *overrides])')
    assert OFF.search("python -m ufp4_megatron.train checkpoint.resume=false")
    assert not OFF.search("checkpoint.interval=10 checkpoint.keep=1")


def _study_sh(*args, **env):
    import os
    import subprocess

    return subprocess.run(
        ["bash", "gpu/study.sh", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=30,
    )


def test_study_sh_refuses_a_bad_round_or_grid_before_setting_up():
    # both refusals happen before gpu/setup.sh (nothing is installed or trained)
    bad_round = _study_sh("12")
    assert bad_round.returncode == 2 and "unknown round 12" in bad_round.stderr
    bad_grid = _study_sh("4", GRID="mian")
    assert bad_grid.returncode == 2
    assert "GRID=mian; give main, ablation, depth, small or prereg" in bad_grid.stderr


def test_study_sh_prereg_refuses_what_would_change_the_design():
    # the pre-registered grid fixes corpus, seeds and steps; its runs never resume across calls
    for env, said in (
        ({"SEEDS": "1-4"}, "SEEDS is set; the prereg grid fixes it"),
        ({"STEPS": "2000"}, "STEPS is set"),
        ({"PAUSE": "1"}, "its runs never resume across calls"),
        ({"CORPUS": "stdlib"}, "CORPUS=stdlib with GRID=prereg"),
    ):
        r = _study_sh("1", GRID="prereg", **env)
        assert r.returncode == 2 and said in r.stderr, (env, r.stderr)


def test_study_sh_refuses_bad_steps_and_packages_before_setting_up():
    steps = _study_sh("3", STEPS="2k", CORPUS="pysrc")
    assert steps.returncode == 2 and "STEPS=2k; give a positive step count" in steps.stderr
    assert _study_sh("3", STEPS="0").returncode == 2
    pkgs = _study_sh("3", CORPUS="pysrc", PACKAGES="torch;rm")
    assert pkgs.returncode == 2 and "give importable names separated by commas" in pkgs.stderr
    stdlib = _study_sh("3", PACKAGES="numpy")
    assert stdlib.returncode == 2 and "PACKAGES is for CORPUS=pysrc" in stdlib.stderr
    pause = _study_sh("3", PAUSE="yes")
    assert pause.returncode == 2 and "PAUSE=yes; give 1 (the budget pauses" in pause.stderr


def test_perf_sh_refuses_a_bad_override_before_setting_up():
    import os
    import subprocess

    bad = subprocess.run(
        ["bash", "gpu/perf.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PERF_SET": "model.cross_entropy_fusion=true oops"},
        timeout=30,
    )
    assert bad.returncode == 2
    assert "PERF_SET entry 'oops'; give KEY=VALUE overrides" in bad.stderr


def _scripts_without_setup(paths):
    # a script that runs the package's modules needs the trainer's dependencies, which a CUDA
    # image lacks until gpu/setup.sh installs them (without it, `bash gpu/perf.sh` alone on a
    # CUDA image dies on `import hydra`)
    return [
        p.name
        for p in paths
        if re.search(r"-m ufp4_megatron\b", p.read_text())
        and "source gpu/setup.sh" not in p.read_text()
    ]


def test_every_gpu_script_that_runs_the_package_sets_up_its_dependencies():
    scripts = sorted((ROOT / "gpu").glob("*.sh"))
    assert any(re.search(r"-m ufp4_megatron\b", p.read_text()) for p in scripts)
    assert _scripts_without_setup(scripts) == []


def test_the_setup_check_sees_a_script_without_it(tmp_path):
    bare = tmp_path / "bare.sh"
    bare.write_text("set -uo pipefail\npython3 -m ufp4_megatron.bench --suite step\n")
    guarded = tmp_path / "guarded.sh"
    guarded.write_text(
        "python3 -c 'import hydra' || source gpu/setup.sh\npython3 -m ufp4_megatron.bench\n"
    )
    assert _scripts_without_setup([bare, guarded]) == ["bare.sh"]


def _source_setup(tmp_path, *, imports: bool = True):
    """`source gpu/setup.sh` with a stand-in python3 on PATH that logs its calls, makes pip's
    --target dir, and imports megatron-core/Hydra/W&B or not."""
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'echo "$*" >> "$FAKE_LOG"\n'
        "if [[ $1 == -m && $2 == pip ]]; then\n"
        '  while (( $# )); do [[ $1 == --target ]] && mkdir -p "$2"; shift; done; exit 0\n'
        "fi\n"
        "[[ $FAKE_IMPORTS == 1 ]]\n"
    )
    fake.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(tmp_path / "log"),
        "FAKE_IMPORTS": "1" if imports else "0",
        "UFP4_SITE": str(tmp_path / "site"),
        "WHEELHOUSE": str(tmp_path / "wheelhouse"),
        "UFP4_TRITON_CACHE": str(tmp_path / "triton-cache"),
    }
    (tmp_path / "log").write_text("")
    out = subprocess.run(
        ["bash", "-c", 'source gpu/setup.sh && echo "PYTHONPATH=$PYTHONPATH"'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out, (tmp_path / "log").read_text()


def test_setup_installs_a_wheelhouse_once_per_node(tmp_path):
    # every suite sources it, several may run in a row on one node: the install (seconds of
    # pip each time) runs only when /tmp/site does not hold this wheelhouse yet
    (tmp_path / "wheelhouse").mkdir()
    wheel = tmp_path / "wheelhouse" / "hydra_core-1.3.8-py3-none-any.whl"
    wheel.write_bytes(b"x" * 10)
    (tmp_path / "wheelhouse" / "unrelated-1.0-py3-none-any.whl").write_bytes(b"y")
    first, log = _source_setup(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "pip install" in log and "hydra_core-1.3.8" in log and "unrelated" not in log
    assert f"PYTHONPATH={tmp_path / 'site'}:{ROOT}" in first.stdout
    again, log = _source_setup(tmp_path)
    assert again.returncode == 0 and "pip" not in log
    assert "holds this wheelhouse already" in again.stdout
    wheel.write_bytes(b"z" * 10)  # another build of the wheel, same name and size: again
    changed, log = _source_setup(tmp_path)
    assert changed.returncode == 0 and "pip install" in log


def test_setup_unpacks_a_carried_triton_cache_once_and_survives_a_damaged_one(tmp_path):
    import tarfile

    house = tmp_path / "wheelhouse"
    (house / "src" / "ab12").mkdir(parents=True)
    (house / "src" / "ab12" / "_pair16_kernel.cubin").write_bytes(b"cubin")
    with tarfile.open(house / "triton-cache.tgz", "w:gz") as t:  # as gpu/README saves it
        t.add(house / "src", arcname=".")
    first, _ = _source_setup(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "Triton cache from" in first.stdout and "(1 entries)" in first.stdout
    cache = tmp_path / "triton-cache"
    assert (cache / "ab12" / "_pair16_kernel.cubin").read_bytes() == b"cubin"
    again, _ = _source_setup(tmp_path)  # the same node: what is there stays
    assert again.returncode == 0 and "Triton cache from" not in again.stdout
    import shutil

    shutil.rmtree(cache)
    (house / "triton-cache.tgz").write_bytes(b"not a tar")
    damaged, _ = _source_setup(tmp_path)
    assert damaged.returncode == 0, damaged.stderr
    assert "does not unpack; the kernels compile afresh" in damaged.stderr
    assert not cache.exists() and not list(tmp_path.glob(".triton-cache.*"))


def test_setup_without_a_wheelhouse_uses_what_is_installed_or_says_what_to_build(tmp_path):
    ok, log = _source_setup(tmp_path, imports=True)
    assert ok.returncode == 0 and "using the installed megatron-core, Hydra and W&B" in ok.stdout
    assert "pip" not in log
    missing, _ = _source_setup(tmp_path, imports=False)
    assert missing.returncode == 1
    assert "build the wheels with make wheelhouse PY=3.12" in missing.stderr


def test_kernels_exact_names_the_tests_that_did_not_finish(tmp_path):
    # a run cut short at KERNELS_TIMEOUT must say which tests it did not reach: the stand-in
    # python3 collects two tests and finishes one
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'a GPU'\n")
    (bin_dir / "python3").write_text(
        "#!/usr/bin/env bash\n"
        'if [[ " $* " == *" --collect-only "* ]]; then echo "t.py::a"; echo "t.py::b"; exit 0; fi\n'
        'echo "t.py::a" >> "$FINISHED_TESTS"; echo "1 passed"\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out)}
    res = subprocess.run(
        ["bash", "gpu/kernels_exact.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (out / "collected.txt").read_text() == "t.py::a\nt.py::b\n"
    assert (out / "finished.txt").read_text() == "t.py::a\n"
    assert (out / "unfinished.txt").read_text() == "t.py::b\n"
    assert "finished 1 of 2 tests" in res.stdout and "t.py::b" in res.stdout


def test_finished_tests_are_named_as_collected_under_loadgroup(tmp_path, monkeypatch):
    # --dist loadgroup may append "@<group>" to a grouped test's node id; the collected list
    # has none, so a finished grouped test would read as unfinished
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location(
        "pytest_finished", ROOT / "gpu/pytest_finished.py"
    )
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    monkeypatch.setenv("FINISHED_TESTS", str(tmp_path / "finished"))
    for nodeid, when in (
        ("t.py::a[row16 ufp4 fprop x rtne]@tests.kernels.test_compile_sm90", "teardown"),
        ("t.py::b@mcore", "teardown"),
        ("t.py::c", "teardown"),
        ("t.py::d", "call"),
    ):
        plugin.pytest_runtest_logreport(types.SimpleNamespace(nodeid=nodeid, when=when))
    assert (tmp_path / "finished").read_text().splitlines() == [
        "t.py::a[row16 ufp4 fprop x rtne]",
        "t.py::b",
        "t.py::c",
    ]


def test_study_sh_keeps_no_fixed_scratch_files():
    # two studies side by side on one node must not share a scratch file (one would empty the
    # other's list of archived runs, which would then archive them again). Scratch files live
    # in the round's own mktemp dir; only the study dirs and the corpus (prepared under a
    # lock) are fixed paths.
    text = (ROOT / "gpu" / "study.sh").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    fixed = set(re.findall(r"/tmp/[\w.-]+", code))
    assert fixed <= {
        "/tmp/study",
        "/tmp/study-pysrc",
        "/tmp/study-prereg",
        "/tmp/corpus",
        "/tmp/preflight.XXXXXX",
        "/tmp/study-scratch.XXXXXX",
    }, fixed


def test_round_report_counts_only_the_steps_trained_in_the_round(tmp_path):
    # a run resumed at step 100 and stopped at 250 trained 150 steps in this round, not 250;
    # one that ran 0 -> 300 and completed, 300; steps logged after the end line do not count
    import importlib.util
    import json

    from ufp4_megatron.study import manifest as mf

    spec = importlib.util.spec_from_file_location("round_report", ROOT / "gpu" / "round_report.py")
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    mf.save(
        tmp_path,
        {
            "version": mf.VERSION,
            "name": "t",
            "runs": [
                {"name": "bf16-s1", "arm": "bf16", "status": "stopped"},
                {"name": "ufp4-s1", "arm": "ufp4", "status": "done"},
            ],
        },
    )
    for name, last in (("bf16-s1", 400), ("ufp4-s1", 300)):
        d = mf.run_dir(tmp_path, name)
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(
            "".join(
                json.dumps({"step": s, "tokens": 1000 * s, "step_time": 0.5}) + "\n"
                for s in range(1, last + 1)
            )
        )
    (tmp_path / "runner-round2.log").write_text(
        "start bf16-s1 on slot 0 (gpu 0, cpus [0, 1]), resuming at step 100\n"
        "start ufp4-s1 on slot 1 (gpu 0, cpus [2, 3])\n"
        "done ufp4-s1 at step 300 (exit 0, 90 s)\n"
        "stopped bf16-s1 at step 250 (exit 0, 95 s)\n"
    )
    assert rr.steps_in_round(tmp_path / "runner-round2.log") == {
        "bf16-s1": (100, 250),
        "ufp4-s1": (0, 300),
    }
    text = rr.report(tmp_path, "2", 0, 100, "2", ["ufp4-s1"])
    assert "the runs trained 450,000 tokens in it (4,500 tokens/s in all" in text
    assert "| ufp4 | 1 | 0.500 |" in text and "1 done, 1 stopped of 2" in text


def test_host_path_probe_runs_and_finds_the_pair_launch_cacheable():
    # a GPU-side measurement's CPU twin (docs/performance.md); a renamed ops or kernel
    # argument would otherwise leave it broken until the next reader runs it
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "gpu/host_path_probe.py", "--calls", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 6 and all("[('_pair16_kernel', True)]" in line for line in lines), lines


def _with_stand_ins(tmp_path, script, *args, tools=(), **env_extra):
    """gpu/`script` with stand-ins for python3 (logs its calls, "[mps] " first where it
    would reach an MPS daemon) and nvidia-smi, and tools' (name, bash body), on an image
    that imports megatron-core/Hydra/W&B already (no wheelhouse): the finished process and
    the calls logged."""
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    python3 = 'echo "${CUDA_MPS_PIPE_DIRECTORY:+[mps] }$*" >> "$FAKE_LOG"\n'
    for name, body in (("python3", python3), ("nvidia-smi", ""), *tools):
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "log"
    log.write_text("")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "WHEELHOUSE": str(tmp_path / "none"),
        "UFP4_SITE": str(tmp_path / "site"),
        "UFP4_TRITON_CACHE": str(tmp_path / "tc"),
        "OUT": str(tmp_path / "out"),
        **env_extra,
    }
    out = subprocess.run(
        ["bash", f"gpu/{script}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out, log.read_text().splitlines()


def test_perf_sh_with_models_none_runs_only_the_profiles(tmp_path):
    """PERF_MODELS=none: no step suite, only the profiles asked for."""
    out, calls = _with_stand_ins(
        tmp_path,
        "perf.sh",
        PERF_TESTS="0",
        PERF_MODELS="none",
        PERF_PROFILES="dense_1p5b:ufp4,dense_1p5b:bf16",
        PERF_MICRO_BATCHES="8",
    )
    assert out.returncode == 0, out.stderr
    assert not [c for c in calls if "--suite step" in c]
    profiles = [c for c in calls if "--suite profile" in c]
    assert len(profiles) == 2 and all("--micro-batches 8" in c for c in profiles)
    assert "--recipe ufp4" in profiles[0] and "--recipe bf16" in profiles[1]


def _perf_graphs_sh(tmp_path, **env_extra):
    return _with_stand_ins(tmp_path, "perf_graphs.sh", RUNS_DIR=str(tmp_path / "runs"), **env_extra)


def test_perf_graphs_sh_refuses_bad_parts_and_variants_before_setting_up(tmp_path):
    for env, said in (
        ({"PARTS": "steps"}, "PARTS=steps; give checks, step, moe or profile"),
        ({"GRAPH_VARIANTS": "eager graphs"}, "GRAPH_VARIANTS entry 'graphs'"),
    ):
        out, calls = _perf_graphs_sh(tmp_path, **env)
        assert out.returncode == 2 and said in out.stderr, (env, out.stderr)
        assert calls == []  # nothing set up or run


def test_perf_graphs_sh_compares_each_variant_and_pads_moe_experts(tmp_path):
    out, calls = _perf_graphs_sh(tmp_path, PARTS="step,moe")
    assert out.returncode == 0, out.stderr
    steps = [c for c in calls if "--suite step" in c]
    assert len(steps) == 2
    dense, moe = steps
    assert "--models dense_1p5b" in dense and "--micro-batches 8" in dense
    assert "--variant local:train.cuda_graph=local" in dense and "full_iteration" not in dense
    assert "--variant eager" in dense and "moe_capacity_factor" not in dense
    assert "--models moe_7p9b" in moe and "--set model.moe_pad_to_capacity=true" in moe
    out, calls = _perf_graphs_sh(tmp_path, PARTS="step", GRAPH_VARIANTS="full_iteration")
    (only,) = [c for c in calls if "--suite step" in c]
    assert only.count("--variant") == 1
    assert "--variant full_iteration:train.cuda_graph=full_iteration" in only


def test_perf_graphs_sh_profiles_each_recipe_under_each_variant(tmp_path):
    """PARTS=profile: one profiled step per model, variant and recipe, the variant's settings
    and MoE's drop-and-pad experts passed to the profile as the step table passes them."""
    out, calls = _perf_graphs_sh(
        tmp_path, PARTS="profile", GRAPH_RECIPES="ufp4,nvfp4", GRAPH_VARIANTS="local_nocache eager"
    )
    assert out.returncode == 0, out.stderr
    profiles = [c for c in calls if "--suite profile" in c]
    moe = "--set model.moe_capacity_factor=1.0 --set model.moe_pad_to_capacity=true"
    assert profiles == [
        "-m ufp4_megatron.bench --suite profile --model moe_7p9b --recipe ufp4 "
        f"--micro-batches 8 --set train.cuda_graph=local --set train.weight_cache=none {moe}",
        "-m ufp4_megatron.bench --suite profile --model moe_7p9b --recipe nvfp4 "
        f"--micro-batches 8 --set train.cuda_graph=local --set train.weight_cache=none {moe}",
        f"-m ufp4_megatron.bench --suite profile --model moe_7p9b --recipe ufp4 --micro-batches 8 {moe}",
        f"-m ufp4_megatron.bench --suite profile --model moe_7p9b --recipe nvfp4 --micro-batches 8 {moe}",
    ]
    assert (tmp_path / "out" / "profile-moe_7p9b-eager-nvfp4.txt").exists()
    _, calls = _perf_graphs_sh(tmp_path, PARTS="profile", GRAPH_MODELS="dense_1p5b")
    profiles = [c for c in calls if "--suite profile" in c]
    assert [c.split("--recipe ")[1].split()[0] for c in profiles] == ["bf16", "ufp4"]
    assert all("moe_" not in c and "weight_cache=none" in c for c in profiles)


def test_study_sh_prereg_rounds_make_no_interim_comparison(tmp_path):
    # the pre-registered stopping rule has no interim look: a prereg round trains and archives,
    # and never runs the loss-gap comparison (which would estimate the primary early); other
    # grids still compare after each round
    node = tmp_path / "node"
    _, calls = _with_stand_ins(tmp_path, "study.sh", "1", GRID="prereg", NODE_DIR=str(node))
    (runner,) = [c for c in calls if c.startswith("-m ufp4_megatron.study")]
    assert "--no-compare" in runner and "--restart-incomplete" in runner
    assert f"--out {node}/study-prereg" in runner
    assert f"data.prefixes=[{node}/corpus/pysrc]" in runner
    _, calls = _with_stand_ins(tmp_path, "study.sh", "1", CORPUS="pysrc", NODE_DIR=str(node))
    (runner,) = [c for c in calls if c.startswith("-m ufp4_megatron.study")]
    assert "--no-compare" not in runner and "--restart-incomplete" not in runner


def test_study_sh_refuses_a_node_dir_hydra_cannot_take(tmp_path):
    for bad in ("relative/dir", "/tmp/a b", "/tmp/a,b"):
        out, calls = _with_stand_ins(tmp_path, "study.sh", "1", NODE_DIR=bad)
        assert out.returncode == 2 and "NODE_DIR=" in out.stderr, (bad, out.stderr)
        assert calls == []  # nothing set up or run


def test_perf_graphs_sh_weight_operand_variants(tmp_path):
    """local is a run's default (auto); local_kept and local_nocache pin the weight cache."""
    variants = "local local_kept local_nocache"
    _, calls = _perf_graphs_sh(tmp_path, PARTS="step", GRAPH_VARIANTS=variants)
    (only,) = [c for c in calls if "--suite step" in c]
    assert "--variant local:train.cuda_graph=local --variant" in only
    assert "--variant local_kept:train.cuda_graph=local train.weight_cache=all" in only
    assert "--variant local_nocache:train.cuda_graph=local train.weight_cache=none" in only


# the MPS control tool: -d starts "the daemon", other calls take one command on stdin
FAKE_MPS_CONTROL = (
    "nvidia-cuda-mps-control",
    'if [[ ${1:-} == -d ]]; then echo "daemon $CUDA_MPS_PIPE_DIRECTORY" >> "$FAKE_LOG"; exit 0; fi\n'
    'read -r cmd; echo "control $cmd" >> "$FAKE_LOG"\n'
    "[[ $cmd == get_server_list ]] && echo 4242\nexit 0\n",
)


def test_study_packing_sh_trains_the_pair_and_its_packings(tmp_path):
    """Without MPS on the node: the eager/graphed pair and the eager packing; the MPS parts
    say they are skipped."""
    out, calls = _with_stand_ins(tmp_path, "study_packing.sh")
    assert out.returncode == 0, out.stderr
    runs = [c for c in calls if "-m ufp4_megatron.train" in c]
    assert len(runs) == 2 + 12 and not [c for c in runs if c.startswith("[mps]")]
    assert all("train.micro_batch=64" in c and "train.seq_len=256" in c for c in runs)
    pair = [c for c in runs if "train.steps=120" in c]
    assert len(pair) == 2 and {"train.cuda_graph=none" in c for c in pair} == {True, False}
    assert len([c for c in runs if "train.steps=1000" in c and "graph=none" in c]) == 12
    assert "MPS parts skipped" in out.stdout
    assert "12 MPS runs: skipped" in out.stdout and "16 MPS runs: skipped" in out.stdout


def test_study_packing_sh_runs_its_mps_packings_through_one_private_daemon(tmp_path):
    import os

    out, calls = _with_stand_ins(
        tmp_path, "study_packing.sh", tools=[FAKE_MPS_CONTROL], PACKS="none:2:1 mps:3:1 local:2:1"
    )
    assert out.returncode == 0, out.stderr
    (daemon,) = [c for c in calls if c.startswith("daemon ")]
    pipe = daemon.split()[1]
    assert pipe.startswith("/tmp/ufp4-mps.")
    runs = [c for c in calls if "-m ufp4_megatron.train" in c]
    through = [c for c in runs if c.startswith("[mps]")]
    assert len(runs) == 3 + 2 + 3 + 2 and len(through) == 1 + 3
    assert all("train.cuda_graph=none" in c for c in through)
    assert len([c for c in through if "train.steps=120" in c]) == 1  # its run beside the pair
    assert (
        "control get_server_list" in calls and "MPS servers while 3 runs train: 4242" in out.stdout
    )
    assert calls[-1] == "control quit"  # quit at the end
    assert not os.path.exists(pipe)


def test_study_packing_sh_refuses_bad_packs_before_setting_up(tmp_path):
    for bad in ("mps:0:90", "gpu:12:90", "none:12", "none:12:90;rm"):
        out, calls = _with_stand_ins(tmp_path, "study_packing.sh", PACKS=f"none:2:1 {bad}")
        assert out.returncode == 2 and f"PACKS entry '{bad}'" in out.stderr, (bad, out.stderr)
        assert calls == []


def test_study_sh_passes_mps_to_the_runner_and_refuses_other_values(tmp_path):
    node = tmp_path / "node"
    _, calls = _with_stand_ins(tmp_path, "study.sh", "1", NODE_DIR=str(node), MPS="off")
    (runner,) = [c for c in calls if c.startswith("-m ufp4_megatron.study")]
    assert "--mps off" in runner
    _, calls = _with_stand_ins(tmp_path, "study.sh", "1", NODE_DIR=str(node))
    (runner,) = [c for c in calls if c.startswith("-m ufp4_megatron.study")]
    assert "--mps auto" in runner  # the default
    out, calls = _with_stand_ins(tmp_path, "study.sh", "1", NODE_DIR=str(node), MPS="yes")
    assert out.returncode == 2 and "MPS=yes; give off, auto or on" in out.stderr
    assert calls == []


def test_te_check_sh_moe_part_resumes_te_grouped_experts_through_the_matrix(tmp_path):
    """PARTS=moe: the checkpoint matrix on moe_small through TE, deterministic; nothing else."""
    out, calls = _with_stand_ins(tmp_path, "te_check.sh", PARTS="moe")
    assert out.returncode == 0, out.stderr[-2000:]
    (matrix,) = [c for c in calls if "test_checkpoint_gpu.py" in c]
    for override in ("model=moe_small", "model.transformer_impl=transformer_engine"):
        assert f"--set {override}" in matrix, matrix
    assert "--set train.deterministic=true" in matrix
    assert not any("te_parity" in c or "te_steps" in c or "te_megatron_lm" in c for c in calls)
    assert "| moe |" in (tmp_path / "out" / "te_check.md").read_text()


def test_te_check_sh_refuses_an_unknown_part(tmp_path):
    out, calls = _with_stand_ins(tmp_path, "te_check.sh", PARTS="parity,moes")
    assert out.returncode == 2 and "PARTS entry 'moes'" in out.stderr, out.stderr
    assert calls == []


def test_te_check_sh_refuses_an_unknown_model_before_setting_up(tmp_path):
    for env in (
        {"TE_STEPS_MODELS": "dense_1p5b,moe_7b9p"},
        {"TE_STEPS_MODELS": "*"},
        {"TE_PROFILE_MODEL": "small"},
    ):
        out, calls = _with_stand_ins(tmp_path, "te_check.sh", PARTS="steps,profile", **env)
        assert out.returncode == 2 and "give dense_1p5b or moe_7p9b" in out.stderr, out.stderr
        assert calls == []


def test_te_check_sh_accepts_the_models_te_steps_knows():
    # te_check.sh refuses a model before its set-up (no Python packages yet), so it keeps its
    # own list; it must name exactly gpu/te_steps.py's models (gpu/te_profile.py's are those)
    import sys

    sys.path.insert(0, str(ROOT / "gpu"))
    try:
        from te_steps import MODELS
    finally:
        sys.path.remove(str(ROOT / "gpu"))
    script = (ROOT / "gpu" / "te_check.sh").read_text()
    (pattern,) = re.findall(r"^\s*case \$m in ([\w|]+)\) ;;", script, re.M)
    assert sorted(pattern.split("|")) == sorted(m.split()[0] for m in MODELS)


def test_te_check_sh_profile_part_and_steps_models(tmp_path):
    """PARTS=steps,profile: the step rows of the models asked for, then the routes' profiles."""
    out, calls = _with_stand_ins(
        tmp_path,
        "te_check.sh",
        PARTS="steps,profile",
        TE_STEPS_MODELS="moe_7p9b",
        TE_PROFILE_MODEL="moe_7p9b",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (steps,) = [c for c in calls if "te_steps.py" in c]
    assert "--models moe_7p9b" in steps, steps
    (prof,) = [c for c in calls if "te_profile.py" in c]
    assert "--out" in prof and "--model moe_7p9b" in prof, prof
    assert not any("test_checkpoint_gpu" in c or "te_parity" in c for c in calls)
    table = (tmp_path / "out" / "te_check.md").read_text()
    assert "| profile |" in table and "| moe | skipped (PARTS)" in table


def test_te_profile_profiles_each_route_with_the_bench_suite(tmp_path):
    """gpu/te_profile.py: the bench's profile suite on the TE route (ufp4, bf16) and the local
    route, the same 2-layer model; a wrong model is refused by argparse."""
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "gpu"))
    try:
        import te_profile
    finally:
        sys.path.pop(0)
    cmds = [te_profile.command("dense_1p5b", r, q) for r, q in te_profile.ROUTES]
    te = [c for c in cmds if "model.transformer_impl=transformer_engine" in c]
    assert len(te) == 2 and {c[c.index("--recipe") + 1] for c in te} == {"ufp4", "bf16"}
    for c in cmds:
        assert c[1:5] == ["-m", "ufp4_megatron.bench", "--suite", "profile"]
        assert "model.num_layers=2" in c and "model.vocab_size=4096" in c
    bad = subprocess.run(
        [sys.executable, "gpu/te_profile.py", "--out", str(tmp_path), "--model", "moe"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "invalid choice: 'moe'" in bad.stderr, bad.stderr


def test_study_packing_sh_starts_every_run_in_a_fresh_dir(tmp_path):
    """Run dirs left in OUT by an earlier invocation are cleared, not resumed: a resumed run
    would report its old steps as this invocation's."""
    stale = [tmp_path / "out" / d for d in ("bit-none", "bit-local", "pack-none-12-1")]
    for d in stale:
        (d / "checkpoints").mkdir(parents=True)
        (d / "metrics.jsonl").write_text('{"step": 120, "loss": 1.0, "step_time": 0.001}\n')
    out, _ = _with_stand_ins(tmp_path, "study_packing.sh")
    assert out.returncode == 0, out.stderr
    assert not [d for d in stale if d.exists()]


def test_gpu_matrices_refuse_a_work_dir_an_earlier_run_left(tmp_path):
    """The checkpoint, CUDA-graph and deterministic matrices run their trainers in --work: one
    holding an earlier run would be resumed and its old curves compared as new. Refused
    before anything runs; gpu/*.sh clear their own work dirs first."""
    import subprocess
    import sys

    used = tmp_path / "work"
    (used / "unbroken" / "checkpoints").mkdir(parents=True)
    for script in ("test_checkpoint_gpu.py", "test_cuda_graph_gpu.py", "test_deterministic_gpu.py"):
        out = subprocess.run(
            [
                sys.executable,
                f"tests/gpu/{script}",
                "--out",
                str(tmp_path / "o"),
                "--work",
                str(used),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2, (script, out.stderr[-2000:])
        assert f"--work {used} holds an earlier run's files" in out.stderr, out.stderr[-2000:]
        assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
