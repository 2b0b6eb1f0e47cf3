"""sglang-sim: gpufleet lab simulator (not SGLang).

A stand-in for ``python -m sglang.launch_server`` (SGLang 0.5.9, or the version ``SGLANG_SIM_ENGINE_VERSION`` names:
engines.py) used on GPU-less lab hosts: the standard library plus PyYAML (for ``--config``). See the README next to
pyproject.toml.
"""

from . import engines

__version__ = "0.1.0"
EMULATED_SGLANG_VERSION = engines.current()  # checked by launch_server.main (engines.problem)
SERVER_VERSION = f"{EMULATED_SGLANG_VERSION}-sim"
BANNER = "gpufleet lab simulator (not SGLang)"
SIM_HEADER = "X-Gpufleet-Simulator"
SIM_HEADER_VALUE = f"sglang-sim {__version__}"
