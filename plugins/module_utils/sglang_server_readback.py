"""What the deploy report reads back from a server host: the environment variables (NCCL_*) the unit's main
process really runs with (``/proc/PID/environ``, else the unit's Environment=) and the last-known-good manifest.
Standard library only; unit-tested with fakes.
"""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_command import run
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_manifest import read_manifest
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import show_properties


def env_readback(props, environ=None, prefix="NCCL_"):
    """The ``prefix`` variables the server really runs with, read back, never recomputed.

    ``environ``: the bytes of ``/proc/<MainPID>/environ`` (source ``process``); without them the unit's
    ``Environment=`` from ``systemctl show`` (source ``unit``). Only ``prefix`` names are kept: the process
    environment also holds the secrets of the EnvironmentFile, and they never leave the host.
    """
    import shlex  # noqa: PLC0415

    if environ:
        items = environ.decode("utf-8", "replace").split("\0")
        source = "process"
    elif "Environment" in props:
        try:
            items = shlex.split(props["Environment"])
        except ValueError:
            items = props["Environment"].split()
        source = "unit"
    else:
        items, source = [], "none"
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep and key.startswith(prefix):
            env[key] = value
    try:
        main_pid = int(props.get("MainPID") or 0)
    except ValueError:
        main_pid = 0
    return {"source": source, "main_pid": main_pid, "nccl_env": dict(sorted(env.items()))}


def readback(unit: str, manifest: str, prefix: str = "NCCL_", runner=run, proc_root: str = "/proc") -> dict:
    """What the deploy report reads back from the host (sglang_server_readback, and sglang_server_last_good right
    after a save): the unit's main process, the ``prefix`` variables it runs with (env_readback) and the manifest."""
    _rc, out, _err = runner(["systemctl", "show", "--property=MainPID", "--property=Environment", unit])
    props = show_properties(out)
    environ = None
    pid = env_readback(props)["main_pid"]
    if pid > 0:
        try:
            with open(f"{proc_root}/{pid}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            environ = None
    return {**env_readback(props, environ, prefix), "manifest": read_manifest(manifest)}
