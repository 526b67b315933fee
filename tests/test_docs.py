"""The docs hold together and speak of the project, not of how it was built.

- Every relative link in a markdown file of the checkout resolves to a file or folder.
- No markdown, Python, shell, YAML or Makefile text speaks of the process that built the
  project (PROCESS_WORDS: who led or coordinated the work, requests to a lent GPU machine,
  what such a machine hands back and how long it stays up, numbered rounds of work, numbers
  in the issue tracker given as explanations). A user's CUDA node or Slurm cluster has none
  of these; comments say why the code is so in terms of the code.

Each pattern hides one letter in a character class (`[l]ead`), so this file's own source
does not match it; the sample lines of the self-test mark a split word with `|`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".sbatch"}
SKIP_DIRS = {".git", ".venv", "runs", "wheelhouse", "build", "node_modules", "__pycache__"}

PROCESS_WORDS = [
    (r"\bthe [l]ead\b", "who led the work"),
    (r"\b[c]oordinator\b", "who coordinated the work"),
    (r"\bwarm [w]indow\b", "how long a lent GPU machine stays up"),
    (r"\bdevice [t]ime\b", "a budget of GPU-machine time; say GPU time for a measurement"),
    (r"\b(?:fresh|warm) (?:[n]odes?|[m]achines?)\b", "the state of a lent GPU machine"),
    (r"\bchained [c]alls?\b", "requests to a GPU machine made one after another"),
    (r"\b(?:device|GPU) [c]alls?\b", "requests to a GPU machine"),
    (r"(?<![-\w])[c]alls? [0-9]", "a numbered request to a GPU machine"),
    (r"\bat most \d+ [f]iles\b", "what a GPU machine hands back"),
    (r"\bGPU [l]eases?\b", "a lent GPU machine"),
    (r"(?<![\w.])[s]essions?(?!\w)", "a stretch of the work"),
    (r"\b(?:earlier|previous) (?:[m]achines?|[s]essions?)\b", "where the work ran before"),
    (r"\b[r]ounds? \d+", "a numbered round of the work"),
    (r"(?<![\w/.-])[i]ssues? #?\d+", "a number in the issue tracker"),
    (r"(?<![\w/&#])#\d{1,3}\b", "a number in the issue tracker"),
]
# The same words in senses that have nothing to do with the work: pytest's fixture scope, the
# operating system's process groups, and the study script's own message for a bad round.
ALLOWED = re.compile(
    r"scope=[\"'][s]ession[\"']|pytest [s]ession|[s]ession[- ](?:scoped|scope|fixtures?)"
    r"|start_new_[s]ession|process [s]ession|unknown [r]ound|test [s]ession"
    r"|\b[s]ession\.(?:config|exitstatus)\b|\([s]ession\b",
    re.I,
)
_PATTERNS = [(re.compile(p, re.I), what) for p, what in PROCESS_WORDS]


def _checked_files() -> list[Path]:
    """The checkout's files (tracked, or untracked and not ignored) that hold text."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode()
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.SubprocessError):  # not a git checkout: walk the tree
        paths = [p for p in ROOT.rglob("*") if not SKIP_DIRS & set(p.relative_to(ROOT).parts)]
    return sorted(
        p for p in paths if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name == "Makefile")
    )


def process_talk(lines) -> list[tuple[int, str, str]]:
    """(line number, matched text, what it speaks of) for each line that speaks of the work."""
    hits = []
    for number, line in enumerate(lines, 1):
        if ALLOWED.search(line):
            line = ALLOWED.sub("", line)
        for pattern, what in _PATTERNS:
            m = pattern.search(line)
            if m:
                hits.append((number, m.group(0), what))
                break
    return hits


def test_no_text_speaks_of_how_the_project_was_built():
    offenders = []
    for path in _checked_files():
        lines = path.read_text(errors="replace").splitlines()
        for number, text, what in process_talk(lines):
            offenders.append(f"{path.relative_to(ROOT)}:{number}: '{text}' ({what})")
    assert not offenders, (
        "text that speaks of how the project was built, not of the project (say it in terms "
        "of the code or the user's machine; history goes to CHANGELOG.md):\n" + "\n".join(offenders)
    )


def test_the_check_sees_process_talk_and_spares_other_senses():
    said = [
        "as the le|ad commits them",
        "within the warm win|dow",
        "no device ti|me left",
        "on a fresh no|de",
        "chained ca|lls",
        "a call returns at most 8 fi|les",
        "in the second ses|sion of the day",
        "rou|nd 1 shed 11 of 12 runs",
        "see iss|ue 10",
        "fixed in #|30",
        "ca|ll 3 (warm)",
        "like the AMD EPYC of earlier mach|ines",
    ]
    for line in said:
        assert process_talk([line.replace("|", "")]), line
    spared = [
        '@pytest.fixture(scope="ses|sion")',
        "proc = Popen(cmd, start_new_ses|sion=True)",
        "each xdist worker runs its own pytest ses|sion",
        "pinned, in its own process ses|sion",
        'assert "unknown rou|nd 12" in err',
        "def pytest_sessionfinish(ses|sion, exitstatus):",
        "    ses|sion.exitstatus = pytest.ExitCode.TESTS_FAILED",
        "the test ses|sion fails on any orphan",
        "pytorch/pytorch|#135712, seen with gloo",
        "pytest-dev/pytest-xdist|#1386",
        "python probe.py --ca|lls 200",
        "the lea|ding dim of the tensor",
        "ops.fprop calls the kernel twice",
        "rounding to nearest, round half to even",
        "GPU time of the layer",
    ]
    for line in spared:
        assert not process_talk([line.replace("|", "")]), line


_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def broken_links(path: Path) -> list[str]:
    """The relative link targets of a markdown file that name nothing in the checkout."""
    text = _FENCE.sub("", path.read_text(errors="replace"))
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL (http:, mailto:, ...) or an anchor in the same page
        rel = target.split("#", 1)[0]
        base = ROOT if rel.startswith("/") else path.parent
        if not (base / rel.lstrip("/")).exists():
            broken.append(target)
    return broken


def test_relative_links_in_markdown_resolve():
    offenders = []
    for path in _checked_files():
        if path.suffix == ".md":
            offenders += [f"{path.relative_to(ROOT)}: ({t})" for t in broken_links(path)]
    assert not offenders, "relative links to nothing:\n" + "\n".join(offenders)


def test_the_link_check_sees_a_broken_link(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("x")
    page = tmp_path / "docs" / "b.md"
    page.write_text(
        "[ok](a.md#top) [up](../docs/) [web](https://x.org) [anchor](#s)\n"
        "[gone](missing.md)\n```\n[in code](nowhere.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md"]
