"""Megatron-Core glue tests. Multi-rank contracts come from ONE 2-rank gloo launch per
pytest session (`mcore_results`, marked `distributed`): Megatron is imported once per rank
and every layout and recipe runs inside it, which keeps the suite under a minute on 2 CPU
cores."""

import pytest
from mcore_harness import run_scenario


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "distributed: uses the shared 2-rank gloo launch of tests/megatron (~1-2 min)"
    )


@pytest.fixture(scope="session")
def mcore_results(tmp_path_factory):
    return run_scenario("suite", tmp_path_factory.mktemp("mcore"))
