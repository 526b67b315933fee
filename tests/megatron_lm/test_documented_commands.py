"""Every documented Megatron-LM command line parses, validates and builds (probe.py), and is
the one gpu/megatron_lm.sh runs.

- docs/megatron-lm.md: each bash block that runs pretrain_gpt.py is marked for the GPU script
  (`<!-- megatron-lm-run: NAME CHECKOUT -->`); bash expands it (a recorder stands in for
  torchrun), and each command builds, on its checkout, the UFP4 linears the GPU script expects.
- README.md: its Megatron-LM snippets are parts of those commands (or of the TransformerEngine
  route's, `<!-- megatron-lm-te-run: NAME -->`, which gpu/te_check.sh runs).
- the flags the patch declares are the ones the docs' flag table lists.
"""

import re

import pytest
from conftest import PATCHES, ROOT, documented_commands, gpu_megatron_lm, te_documented_commands

DOC = ROOT / "docs" / "megatron-lm.md"
COMMANDS = documented_commands()


def test_docs_have_every_route_of_the_gpu_script():
    assert {c["run"] for c in COMMANDS} == set(gpu_megatron_lm.EXPECTED)
    assert sum(c["run"] == "resume" for c in COMMANDS) == 2  # stop at 20, then resume


def test_every_pretrain_gpt_block_is_marked_for_the_gpu_script():
    text = DOC.read_text()
    # megatron-lm-te-run: the TransformerEngine route's blocks (gpu/te_megatron_lm.py)
    blocks = re.findall(
        r"(<!-- megatron-lm(?:-te)?-run: [^>]*-->\s*\n)?```bash\n(.*?)```", text, re.S
    )
    for marker, body in blocks:
        if "pretrain_gpt.py" in body or "ARGS=(" in body:
            assert marker, f"unmarked command block in {DOC.name}:\n{body}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c["name"] for c in COMMANDS])
def test_documented_command_builds_its_ufp4_linears(cmd, stock_results, patched_results):
    assert cmd["torchrun"] == ["--standalone", "--nproc-per-node", "1"]
    results = stock_results if cmd["checkout"] == "stock" else patched_results
    r = results[cmd["name"]]
    assert r["stage"] == "ok", r
    n_ufp4, recipe = gpu_megatron_lm.EXPECTED[cmd["run"]]
    assert r["ufp4"] == n_ufp4 and len(r["linears"]) == 17
    assert {v[1] for v in r["linears"].values()} - {None} == ({recipe} if recipe else set())


def test_resume_commands_save_and_load_the_same_directory():
    first, second = [c["argv"] for c in COMMANDS if c["run"] == "resume"]
    for argv in (first, second):
        assert argv[argv.index("--save") + 1] == argv[argv.index("--load") + 1]
    assert first[first.index("--exit-interval") + 1] == "20" and "--exit-interval" not in second


def test_readme_snippets_are_parts_of_documented_commands():
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("Megatron-LM users") :].split("\n\n")[0]
    snippets = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", paragraph)]
    commands = [" ".join([*c["torchrun"], "pretrain_gpt.py", *c["argv"]]) for c in COMMANDS]
    commands += [" ".join(c["argv"]) for c in te_documented_commands()]  # TE route's blocks
    envs = [" ".join(f"{k}={v}" for k, v in c["env"].items()) for c in COMMANDS]
    flagged = [s for s in snippets if s.startswith("--") or "=" in s]
    assert flagged, "the README's Megatron-LM paragraph shows no flags"
    for s in flagged:
        assert any(s in c for c in commands + envs), f"README snippet {s!r} is in no command"


def test_docs_flag_table_lists_the_patch_flags():
    declared = set()
    for patch in PATCHES:
        declared |= set(re.findall(r"^\+.*add_argument\('(--[a-z0-9-]+)'", patch.read_text(), re.M))
    assert declared == {
        "--fp4-format",
        "--fp4-recipe",
        "--fp4-block",
        "--fp4-rht",
        "--no-fp4-sr-dy",
    }
    table = DOC.read_text().split("## Route 2")[1]
    for flag in declared:
        assert f"`{flag}" in table


def test_resume_check_models_megatron_lms_first_iteration_log():
    """A real H200 run: after --load at iteration 20, Megatron-LM printed 6.944539 at
    iteration 22 where the unbroken run printed 6.981398, with every other iteration (and the
    grad norm of 22) equal. Its training_log keeps the loss sums of a process's first iteration,
    so that line is the mean of 21 (6.907681) and 22: the resume is exact, the checker must say
    so, and must still fail a resume that really differs."""
    tool = gpu_megatron_lm  # a later `from conftest` gets the conftest pytest loaded last

    unbroken = {20: 7.116663, 21: 6.907681, 22: 6.981398, 23: 7.078825, 24: 6.972014}
    resumed = {21: 6.907681, 22: 6.944539, 23: 7.078825, 24: 6.972014}
    want = tool.logged_after_restart(unbroken, 20)
    assert abs(want[22] - resumed[22]) <= 1e-6 * resumed[22]
    assert {i: want[i] for i in (21, 23, 24)} == {i: resumed[i] for i in (21, 23, 24)}

    def run(loss):
        log = "successfully loaded checkpoint from /tmp/c at iteration 20"
        return {
            "rc": 0,
            "loss": {**{i: unbroken.get(i, 7.0) for i in range(1, 21)}, **loss},
            "probes": [],
            "log": log,
        }

    base = {i: unbroken.get(i, 7.0) for i in range(1, 25)}
    results = {
        "spec-ufp4": {"rc": 0, "loss": base, "probes": [], "log": ""},
        "resume": run(resumed),
    }
    check = dict((n, ok) for n, ok, _ in tool.evaluate(results, 24))
    assert [ok for n, ok in check.items() if n.startswith("resume: saved")] == [True]
    results["resume"] = run({**resumed, 23: 7.078826})
    check = dict((n, ok) for n, ok, _ in tool.evaluate(results, 24))
    assert [ok for n, ok in check.items() if n.startswith("resume: saved")] == [False]
