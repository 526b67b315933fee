import os

import pytest

# W&B never reaches the network from tests; runs that log go offline into temp dirs.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(scope="module")
def hydra_configs():
    """One Hydra context over the package's configs for a whole module (composing is then
    milliseconds): `pytestmark = pytest.mark.usefixtures("hydra_configs")`."""
    from ufp4_megatron.train.overrides import training_configs

    with training_configs():
        yield


# Fixtures that train or probe once and are shared by several tests. Under pytest-xdist every
# worker runs its own pytest session, so a session-scoped or module fixture runs again on each
# worker that gets one of its tests (the Megatron-LM probes of test_documented_commands.py
# take ~45 s each). The tests that use one share an xdist group (make test runs --dist
# loadgroup), so the fixture runs once: session-scoped fixtures one group per name below,
# module fixtures one group per module.
SHARED_SESSION = {"mcore_results": "mcore", "stock_results": "megatron_lm",
                  "patched_results": "megatron_lm", "patched_root": "megatron_lm"}
SHARED_MODULE = ("unbroken", "te_results", "sr", "compiled", "trained")


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
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)
