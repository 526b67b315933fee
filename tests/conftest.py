import os
import signal
import time
import uuid
from pathlib import Path

import pytest

# W&B never reaches the network from tests; runs that log go offline into temp dirs.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# Every process a test starts inherits this mark (xdist workers too: the controller sets it
# first). At the end of the pytest session, a marked process that is neither pytest nor one
# of its descendants was orphaned by a test (its parent died, e.g. a SIGKILLed trainer's
# helper) and outlived it: the pytest session fails, naming it.
SESSION_MARK = "UFP4_TEST_SESSION"
os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)


def _marked_orphans() -> list[int]:
    mark = f"{SESSION_MARK}={os.environ[SESSION_MARK]}".encode()
    parent, marked = {}, []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            parent[int(pid)] = int(stat[1])
            if stat[0] != "Z" and mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                marked.append(int(pid))
        except (OSError, IndexError, ValueError):
            continue

    def descends(pid: int) -> bool:
        seen = set()
        while pid not in seen and pid > 1:
            if pid == os.getpid():
                return True
            seen.add(pid)
            pid = parent.get(pid, 0)
        return False

    ancestors, p = set(), os.getppid()
    while p > 1 and p not in ancestors:
        ancestors.add(p)
        p = parent.get(p, 0)
    return [pid for pid in marked if pid not in ancestors and not descends(pid)]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or not Path("/proc/self/stat").exists():
        return  # an xdist worker (the controller checks for all), or no /proc
    deadline = time.monotonic() + 10
    while (orphans := _marked_orphans()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not orphans:
        return
    for pid in orphans:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160]
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        print(
            f"\nERROR: process {pid} ({cmd.decode(errors='replace')}) outlived the test "
            "that started it (killed now)"
        )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="module")
def hydra_configs():
    """One Hydra context over the package's configs for a whole module (composing is then
    milliseconds): `pytestmark = pytest.mark.usefixtures("hydra_configs")`."""
    from ufp4_megatron.train.overrides import training_configs

    with training_configs():
        yield


TRAIN_TESTS = Path(__file__).resolve().parent / "train"


@pytest.fixture(scope="module", autouse=True)
def _trainer_tests_start_processes_without_gpus(request):
    """tests/train runs the trainer as CI does, on the CPU: every process a test there starts
    (trainers, torchrun, converters) sees no GPU, so on a GPU node `pytest tests/train`
    checks what `make test` checks (the trainer refuses train.device=cpu where CUDA is
    visible; a GPU run prints MFU, picks NCCL and sizes the weight cache by the GPU's
    memory). The trainer's GPU runs are tests/gpu's. Module-scoped and autouse, so it is in
    place before the module fixtures that train once for several tests. (Here and not in a
    tests/train/conftest.py: tests elsewhere import their own directory's `conftest`.)
    In this process CUDA may be initialised already (a kernel test on the same worker), so
    the variable cannot hide the GPU from it: the trainer's checks run in-process ask
    `torch.cuda.is_available()`, which says what the started processes see."""
    if request.path.parent != TRAIN_TESTS:
        yield
        return
    import torch

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        mp.setattr(torch.cuda, "is_available", lambda: False)
        yield


# Fixtures that train or probe once and are shared by several tests. Under pytest-xdist every
# worker runs its own pytest session, so a session-scoped or module fixture runs again on each
# worker that gets one of its tests (the Megatron-LM probes of test_documented_commands.py
# take ~45 s each). The tests that use one share an xdist group (make test runs --dist
# loadgroup), so the fixture runs once: session-scoped fixtures one group per name below,
# module fixtures one group per module.
SHARED_SESSION = {
    "mcore_results": "mcore",
    "stock_results": "megatron_lm",
    "patched_results": "megatron_lm",
    "patched_root": "megatron_lm",
}
SHARED_MODULE = ("unbroken", "te_results", "sr", "compiled", "trained", "stopped")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = getattr(item, "fixturenames", ())
        group = next((g for f, g in SHARED_SESSION.items() if f in names), None)
        if group is None and any(f in names for f in SHARED_MODULE):
            group = item.module.__name__
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_xdist_suffix(config, items):
    """xdist 3.8's loadgroup tells the scheduler an item's group by appending @group to its
    nodeid, writing item._nodeid; pytest 9.2 keeps the nodeid in item._id, so the suffix no
    longer takes and groups are silently spread over the workers
    (pytest-dev/pytest-xdist#1386). Here the suffix is added where xdist's did not take."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers only
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest before 9.2: xdist's own suffix works
        return
    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)
