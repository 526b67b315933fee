"""pytest plugin for gpu/kernels_exact.sh (`-p pytest_finished`, gpu/ on PYTHONPATH): appends
the node id of every test whose teardown ran, passed or not, to $FINISHED_TESTS. A run cut
short at its time limit then names exactly the tests that did not finish; parsing `-v` lines
could not (node ids hold spaces, and faulthandler dumps land on the same line)."""

import os
import re

# --dist loadgroup may append "@<group>" to a grouped test's node id (tests/conftest.py);
# the collected list has none. Groups are module or fixture names.
_GROUP_SUFFIX = re.compile(r"@[A-Za-z0-9_.]+$")


def pytest_runtest_logreport(report):
    path = os.environ.get("FINISHED_TESTS")
    if path and report.when == "teardown":
        with open(path, "a") as f:  # xdist: the controller and the worker both append
            f.write(_GROUP_SUFFIX.sub("", report.nodeid) + "\n")
