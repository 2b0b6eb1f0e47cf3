import sys
from pathlib import Path

# The sglang_server scenarios' helpers (unit, report, asking the server).
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "roles" / "sglang_server" / "molecule" / "shared"))
pytest_plugins = ["gpufleet_testinfra"]
