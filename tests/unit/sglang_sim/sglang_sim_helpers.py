"""Helpers for the sglang-sim tests: run the simulator as a subprocess on loopback with tmp GPU state, on a real
(tiny) model folder."""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SIM_SRC = REPO / "lab" / "sglang-sim" / "src"
if str(SIM_SRC) not in sys.path:
    sys.path.insert(0, str(SIM_SRC))

LAB = REPO / "lab"
GPU_TOTAL_MIB = 16384
GPU_RESERVED_MIB = 384


_TINY_MODEL: list[Path] = []


def tiny_model() -> Path:
    """A real model folder, as the lab stages one: the lab test hub's tiny model (lab/testhub/model.py
    ``files_for(1)``: config.json of a LlamaForCausalLM, generation config, tokenizer, three safetensors shards and
    their index), written once per test process into a temporary folder that goes at exit. Every simulator the
    tests start serves it (``Sim.model_path``), as a lab host serves the folder model_weights staged."""
    if not _TINY_MODEL:
        if str(LAB) not in sys.path:
            sys.path.insert(0, str(LAB))
        from testhub import model

        folder = Path(tempfile.mkdtemp(prefix="gpufleet-tiny-model-"))
        atexit.register(shutil.rmtree, folder, True)
        for name, content in model.files_for(1).items():
            (folder / name).write_bytes(content)
        _TINY_MODEL.append(folder)
    return _TINY_MODEL[0]


def write_profile(directory: Path, n_gpus: int = 2) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    profile = {
        "name": f"test-x{n_gpus}",
        "driver_version": "570.172.08",
        "gpus": [
            {
                "index": i,
                "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                "uuid": f"GPU-00000000-0000-0000-0000-00000000000{i}",
                "pci_bus_id": f"00000000:0{i + 1}:00.0",
                "memory_total_mib": GPU_TOTAL_MIB,
                "memory_reserved_mib": GPU_RESERVED_MIB,
                "compute_cap": "12.0",
            }
            for i in range(n_gpus)
        ],
    }
    path = directory / "profile.json"
    path.write_text(json.dumps(profile))
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(entry))
    return out


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return False
    return text[text.rfind(")") + 2 :].split()[0] not in ("Z", "X")


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()

    def sse(self) -> list:
        events = []
        for block in self.text.split("\n\n"):
            block = block.strip()
            if not block:
                continue
            assert block.startswith("data: "), block
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events


class Sim:
    """One simulator process (python -m sglang_sim.launch_server) with its own GPU profile/state dirs."""

    def __init__(self, tmp: Path, args: list[str] | None = None, env: dict[str, str] | None = None, n_gpus=2):
        self.tmp = tmp
        self.port = free_port()
        self.profile_dir = tmp / "profile"
        self.state_dir = tmp / "gpusim-state"
        write_profile(self.profile_dir, n_gpus)
        self.log_path = tmp / f"sim-{self.port}.log"
        self.model_path = str(tiny_model())
        self.args = ["--model-path", self.model_path, "--port", str(self.port)] + (args or [])
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith(("SGLANG_SIM_", "SGL_", "GPUSIM_")):
                del self.env[k]
        self.env.update(
            {
                "PYTHONPATH": str(SIM_SRC),
                "GPUSIM_PROFILE_DIR": str(self.profile_dir),
                "GPUSIM_STATE_DIR": str(self.state_dir),
                "SGLANG_SIM_LOAD_SECONDS": "0.1",
                "SGLANG_SIM_GRAPH_SECONDS": "0.1",
                "SGLANG_SIM_TOKENS_PER_S": "2000",
                "SGLANG_SIM_DRAIN_LOG_INTERVAL": "0.2",
                "NO_PROXY": "*",
            }
        )
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self.known_pids: set[int] = set()

    # -- process
    def start(self) -> Sim:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_sim.launch_server", *self.args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def children(self) -> list[int]:
        kids = proc_children(self.pid)
        self.known_pids.update(kids)
        return kids

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, needle: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log()
            if needle in text:
                return text
            if self.proc is not None and self.proc.poll() is not None:
                text = self.log()
                if needle in text:
                    return text
                raise AssertionError(f"sim exited rc={self.proc.returncode} before {needle!r}:\n{text}")
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {needle!r} in log:\n{self.log()}")

    def wait_exit(self, timeout: float = 10.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.children()
        self.proc.send_signal(sig)

    def stop(self) -> None:
        """Kill whatever is left of this simulator (main process, children, orphans)."""
        if self.proc is not None and self.proc.poll() is None:
            self.children()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in list(self.known_pids) + self.registry_pids():
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if hasattr(self, "_log"):
            self._log.close()

    # -- registry
    def registry(self) -> dict[int, dict]:
        out = {}
        if not self.state_dir.is_dir():
            return out
        for p in self.state_dir.glob("alloc-*.json"):
            with contextlib.suppress(ValueError, OSError):
                entry = json.loads(p.read_text())
                out[int(entry["pid"])] = entry
        return out

    def registry_pids(self) -> list[int]:
        return list(self.registry())

    # -- HTTP (loopback only)
    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 15.0) -> Response:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None
            hdrs = dict(headers or {})
            if body is not None:
                data = json.dumps(body).encode()
                hdrs.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def get(self, path: str, **kw) -> Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body, **kw) -> Response:
        return self.request("POST", path, body=body, **kw)

    def status(self, path: str = "/health") -> int | None:
        try:
            return self.get(path, timeout=2).status
        except OSError:
            return None

    def wait_status(self, code: int, path: str = "/health", timeout: float = 10.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.status(path) == code:
                return time.monotonic() - t0
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"sim exited rc={self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        raise AssertionError(f"{path} never answered {code}:\n{self.log()}")

    def wait_ready(self, timeout: float = 10.0) -> Sim:
        self.wait_status(200, "/health", timeout)
        return self
