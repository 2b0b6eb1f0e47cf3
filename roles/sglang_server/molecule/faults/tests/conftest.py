import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shared"))
pytest_plugins = ["gpufleet_testinfra"]

from fault_common import FAULTS  # noqa: E402


@pytest.fixture(scope="module", params=list(FAULTS))
def fault(request):
    """Each fault kind in turn (pytest runs every test of a module for one kind before the next kind)."""
    return request.param
