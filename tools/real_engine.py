#!/usr/bin/env python3
"""`make real-engine [REAL_ENGINE_LANE=<lock>]`: an engine lane's real SGLang on a GPU-less lab host (default the
production lock sglang-cu128, SGLang 0.5.9; the other lanes: sglang-cu128-0.5.10, sglang-cu130).

Steps (each timed; logs and evidence under .cache/real-engine/<lane>/, the wheelhouse cached outside the tree):
  1. the lane's wheelhouse (locks/update_locks.py wheelhouse-production; downloads only what is missing)
     and the lab wheelhouse (simulated engine);
  2. lab equipment built on the controller: the lock's Python 3.12 (the controller's, as a tarball) and a
     libcuda.so.1 stub without devices (a GPU-less host has no NVIDIA driver; sgl_kernel links it);
  3. its own lab (`realengine`, one rtx-pro-6000x8-vm host), lab/real-engine/prepare.yml;
  4. last good version: ml_env with the lab lock (simulator) + playbooks/deploy_server.yml (simulated engine);
  5. ml_env with the lane's lock from the controller wheelhouse (offline, no CUDA check);
  6. the real `python -m sglang.launch_server --help` of that release, saved;
  7. playbooks/deploy_server.yml with the example inventory's flags (inventory/examples/glm5-rtxpro6000, written
     for 0.5.9; migrated to the lane's engine by the collection's migration table, as upgrade_plan.yml shows it;
     the model a local folder, LOCAL_MODEL) and the real engine: it must fail; the role must report the engine's
     own error and the phase and roll back to the simulator, which must serve again (a generation is asked for).
The lab is taken down at the end unless REAL_ENGINE_KEEP=1 (then a rerun reuses the built release).
Exit 0 only when step 7 ends as described.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "collections"), str(ROOT / "lab")]
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_flag_migration import (  # noqa: E402
    engine_lane,
    migrate_layers,
)

LANE = os.environ.get("REAL_ENGINE_LANE", "sglang-cu128")
CACHE = Path(os.environ.get("REAL_ENGINE_CACHE", ROOT / ".cache" / "real-engine" / LANE))
WHEELHOUSE = Path(os.environ.get("REAL_ENGINE_WHEELHOUSE", f"/var/cache/gpufleet-lab/wheelhouse-{LANE}"))
LAB = os.environ.get("REAL_ENGINE_LAB", "realengine")
WHEELHOUSE_PORT = int(os.environ.get("REAL_ENGINE_WHEELHOUSE_PORT", "8470"))
HOST = f"{LAB}-01"
# two levels below the root, as the lab group_vars expect (inventory_dir/../../.cache/ml-env)
INVENTORY = ROOT / "inventory" / "real-engine"
EXAMPLE = ROOT / "inventory" / "examples" / "glm5-rtxpro6000" / "group_vars"
LAB_PYTHON = "/opt/gpufleet-lab/python-3.12/bin/python3.12"
# the fleet's reports folder: reports/<inventory folder name>/ (playbooks/vars/fleet.yml)
REPORT = ROOT / "reports" / INVENTORY.name / "deploy" / f"{HOST}.json"
# The engine's own words on a host without a GPU, per engine version: srt/utils/common.py get_device() of each wheel
# (0.5.10.post1: line 1853; 0.5.23: line 1125, where platform plugins joined the search).
ENGINE_ERRORS = {
    "0.5.9": "No accelerator (CUDA, XPU, HPU, NPU, MUSA) is available.",
    "0.5.10.post1": "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) is available.",
    "0.5.23": "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available.",
}
# the version the example inventory's flags are written for (its lane is the production lock's)
EXAMPLE_ENGINE = "0.5.9"
# The model folder the real engine is given (lab/real-engine/prepare.yml copies CACHE/model there): the example's
# hub id cannot be fetched in the lab, and SGLang 0.5.23 reads the model's config before it looks for a GPU.
LOCAL_MODEL = "/srv/models/real-engine-tiny"

TIMINGS: dict[str, float] = {}


def step(name: str, argv: list[str], *, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run one step with its output teed into CACHE/<name>.log; records its duration."""
    print(f"==> {name}: {' '.join(map(str, argv))}", flush=True)
    started = time.monotonic()
    log = CACHE / f"{name}.log"
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out = []
        for line in proc.stdout:
            handle.write(line)
            out.append(line)
            if "FAILED - RETRYING" not in line:
                sys.stdout.write(line)
        proc.wait()
    TIMINGS[name] = round(time.monotonic() - started, 1)
    print(f"<== {name}: rc {proc.returncode} in {TIMINGS[name]} s (log {log})", flush=True)
    result = subprocess.CompletedProcess(argv, proc.returncode, "".join(out), "")
    if check and proc.returncode != 0:
        raise SystemExit(f"real-engine: step {name} failed (rc {proc.returncode}); see {log}")
    return result


def lab(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufleet_lab", "--name", LAB, *args]


def lab_exec(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(lab("exec", HOST, "--", *cmd), cwd=ROOT, capture_output=True, text=True, check=False)


def python_tarball() -> Path:
    """The controller's Python 3.12 (the lock's python_version) as a tarball for the lab host."""
    target = CACHE / "python-3.12.tar"
    if target.exists():
        return target
    # REAL_ENGINE_PYTHON, else a pyenv 3.12 (this machine kind's image has one), else python3.12 on PATH
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [os.environ.get("REAL_ENGINE_PYTHON", "")]
    candidates += [str(p) for p in sorted(pyenv_root.glob("versions/3.12.*/bin/python3.12"), reverse=True)]
    candidates += [shutil.which("python3.12") or ""]
    found = next((c for c in candidates if c and subprocess.run([c, "-V"], capture_output=True).returncode == 0), None)
    if not found:
        raise SystemExit("real-engine: no Python 3.12 on the controller (set REAL_ENGINE_PYTHON): the lock is for 3.12")
    prefix = subprocess.run(
        [found, "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    skip = ("lib/python3.12/test/", "lib/python3.12/site-packages/", "lib/python3.12/idlelib/")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = info.name.removeprefix("./")
        if any(name.startswith(s) for s in skip) or "__pycache__" in name:
            return None
        return info

    tmp = target.with_suffix(".part")
    with tarfile.open(tmp, "w") as tar:
        tar.add(prefix, arcname=".", filter=keep)
    tmp.rename(target)
    print(f"python 3.12 from {prefix}: {target} ({target.stat().st_size >> 20} MiB)")
    return target


def local_model() -> Path:
    """The lab test hub's tiny model (lab/testhub/model.py: a Llama config, tokenizer and small random shards)."""
    from testhub import model

    out = CACHE / "model"
    out.mkdir(parents=True, exist_ok=True)
    for name, data in model.files_for(1).items():
        (out / name).write_bytes(data)
    return out


def driver_stub() -> Path:
    """A libcuda.so.1 with no device: every driver entry point sgl_kernel links returns CUDA_ERROR_NO_DEVICE."""
    out = CACHE / "libcuda-stub"
    lib = out / "libcuda.so.1"
    if lib.exists():
        return lib
    out.mkdir(parents=True, exist_ok=True)
    # SGLang's kernel wheel: sgl_kernel up to 0.5.9, sglang_kernel since
    wheels = sorted(WHEELHOUSE.glob("sgl_kernel-*.whl")) + sorted(WHEELHOUSE.glob("sglang_kernel-*.whl"))
    if not wheels:
        raise SystemExit(f"real-engine: no sgl_kernel or sglang_kernel wheel in {WHEELHOUSE}")
    symbols: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheels[0]) as whl:
        for name in whl.namelist():
            if name.endswith(".so"):
                path = whl.extract(name, tmp)
                nm = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True, check=True)
                for line in nm.stdout.splitlines():
                    sym = line.split()[-1].split("@")[0]
                    if sym.startswith("cu") and len(sym) > 2 and sym[2].isupper():
                        symbols.add(sym)
    source = [
        "/* gpufleet lab equipment: libcuda.so.1 of a host WITHOUT a GPU. Not NVIDIA's driver: the entry points",
        f"   {wheels[0].name} links, each returning CUDA_ERROR_NO_DEVICE (100). */",
        'const char gpufleet_lab_stub[] = "gpufleet lab: libcuda stub, no GPU";',
        *(f"int {sym}(void) {{ return 100; }}" for sym in sorted(symbols)),
    ]
    (out / "libcuda-stub.c").write_text("\n".join(source) + "\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", lib, out / "libcuda-stub.c"], check=True
    )
    print(f"libcuda.so.1 stub with {len(symbols)} entry points: {', '.join(sorted(symbols))}")
    return lib


def serve_wheelhouse() -> tuple[subprocess.Popen, str]:
    """The controller wheelhouse over HTTP on the lab bridge's gateway (the host's default gateway), read by uv
    on the host as a URL wheelhouse: Ansible's copy of 169 files (4.8 GiB) took 1057 s on this machine."""
    route = lab_exec("ip", "-4", "route", "show", "default").stdout.split()
    gateway = route[route.index("via") + 1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(WHEELHOUSE_PORT), "--bind", gateway, "--directory", WHEELHOUSE],
        stdout=(CACHE / "wheelhouse-http.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://{gateway}:{WHEELHOUSE_PORT}/"
    for _ in range(50):
        if lab_exec("curl", "-fsS", "-o", "/dev/null", url).returncode == 0:
            return server, url
        time.sleep(0.2)
    server.terminate()
    raise SystemExit(f"real-engine: the wheelhouse server on {url} does not answer from the lab host")


def lane() -> dict:
    """The lane's lock (locks/<LANE>): its pinned sglang and CUDA version."""
    found = engine_lane(LANE, ROOT / "locks", "REAL_ENGINE_LANE")
    if found["problem"]:
        raise SystemExit(f"real-engine: {found['problem']}")
    if found["engine_version"] not in ENGINE_ERRORS:
        raise SystemExit(
            f"real-engine: REAL_ENGINE_LANE {LANE} pins sglang {found['engine_version']}, whose error on a GPU-less"
            f" host tools/real_engine.py's ENGINE_ERRORS does not know (one of {', '.join(ENGINE_ERRORS)})"
        )
    return found


def example_flags(engine_version: str) -> tuple[dict, list[dict]]:
    """The example inventory's flag layers (written for EXAMPLE_ENGINE) migrated to engine_version, and the changes
    made; a flag no migration rule maps stops the run (upgrade_plan.yml would fail that host the same way)."""
    layers: dict = {}
    for group in ("all", "rtx_pro_6000", "glm5"):
        data = yaml.safe_load((EXAMPLE / group / "sglang_server.yml").read_text())
        layers.update({k: v for k, v in data.items() if k.startswith("sglang_server_args_")})
    changes: list[dict] = []
    if engine_version != EXAMPLE_ENGINE:
        migrated = migrate_layers(layers, EXAMPLE_ENGINE, engine_version)
        if migrated["unmapped"]:
            raise SystemExit(f"real-engine: flags no migration rule maps to {engine_version}: {migrated['unmapped']}")
        layers, changes = migrated["layers"], migrated["changes"]
    model = dict(layers["sglang_server_args_model"])
    model.pop("model-path", None)
    model["model"] = LOCAL_MODEL
    layers["sglang_server_args_model"] = model
    return layers, changes


def write_vars(wheelhouse_url: str, engine_version: str) -> tuple[Path, Path, list[dict]]:
    ml = CACHE / "ml-env-real.yml"
    ml.write_text(
        yaml.safe_dump(
            {
                "ml_env_lock": LANE,
                "ml_env_wheelhouse": wheelhouse_url,
                "ml_env_offline": True,
                "ml_env_python_interpreter": LAB_PYTHON,
                # no GPU in the lab: torch.cuda.is_available() is false by construction
                "ml_env_cuda_check": False,
            }
        )
    )
    flags, changes = example_flags(engine_version)
    flags.update(
        {
            # the lane whose argument table checks the flags (the role reads it from ml_env_lock)
            "ml_env_lock": LANE,
            "sglang_server_module": "sglang.launch_server",
            # the lab's simulator settings (SGLANG_SIM_*) are not the real engine's
            "sglang_server_environment": {},
            "sglang_server_omp_num_threads": 8,
            "sglang_server_ready_timeout_s": 900,
        }
    )
    server = CACHE / "example-flags-real-engine.yml"
    server.write_text(yaml.safe_dump(flags, sort_keys=False))
    return ml, server, changes


def ansible(playbook: str, *extra: str) -> list[str]:
    return [ROOT / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY, playbook, *extra]


def main() -> int:
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # as the Makefile sets them (the runner also works on its own)
    os.environ["PYTHONPATH"] = str(ROOT / "lab")
    os.environ["PATH"] = f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"
    os.environ.setdefault("GPUFLEET_ROOT", str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    env = {"REAL_ENGINE_CACHE": str(CACHE), "ANSIBLE_FORCE_COLOR": "0"}
    py = sys.executable
    engine = lane()["engine_version"]
    print(f"real-engine: lane {LANE} (sglang {engine}), wheelhouse {WHEELHOUSE}, logs {CACHE}", flush=True)
    wheelhouse = ["locks/update_locks.py", "wheelhouse-production", "--name", LANE, "--dir", WHEELHOUSE]
    step("01-wheelhouse-production", [py, *wheelhouse])
    step("02-wheelhouse-lab", [py, "locks/update_locks.py", "wheelhouse"])
    python_tarball()
    driver_stub()
    local_model()
    up = ("up", "--hosts", "1", "--profile", "rtx-pro-6000x8-vm", "--inventory", INVENTORY / "hosts.yml")
    step("03-lab-up", lab(*up))
    server, wheelhouse_url = serve_wheelhouse()
    ml_vars, server_vars, migrated = write_vars(wheelhouse_url, engine)
    try:
        step("04-prepare", ansible("lab/real-engine/prepare.yml"), env=env)
        step("05-ml-env-sim", ansible("playbooks/ml_env.yml"), env=env)
        step("06-deploy-sim", ansible("playbooks/deploy_server.yml"), env=env)
        sim_release = lab_exec("readlink", "-f", "/opt/ml-env/current").stdout.strip()
        step("07-ml-env-real", ansible("playbooks/ml_env.yml", "-e", f"@{ml_vars}"), env=env)
        real_release = lab_exec("readlink", "-f", "/opt/ml-env/current").stdout.strip()
        if real_release == sim_release:
            raise SystemExit("real-engine: ml_env did not switch to the production release")
        t0 = time.monotonic()
        helped = lab_exec("env", "-C", "/tmp", f"{real_release}/bin/python", "-m", "sglang.launch_server", "--help")
        TIMINGS["08-help"] = round(time.monotonic() - t0, 1)
        (CACHE / "launch_server-help.txt").write_text(helped.stdout)
        (CACHE / "launch_server-help.stderr").write_text(helped.stderr)
        print(f"==> --help: rc {helped.returncode}, {len(helped.stdout.splitlines())} lines in {TIMINGS['08-help']} s")
        if REPORT.exists():
            REPORT.unlink()
        real = ansible("playbooks/deploy_server.yml", "-e", f"@{server_vars}")
        bad = step("09-deploy-real", real, env=env, check=False)
        problems = check_outcome(bad, sim_release, ENGINE_ERRORS[engine])
        evidence = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "lane": LANE,
            "engine_version": engine,
            "flags_migrated": migrated,
            "lab": LAB,
            "host": HOST,
            "sim_release": sim_release,
            "real_release": real_release,
            "release_size": lab_exec("du", "-sh", "--apparent-size", real_release).stdout.split("\t")[0],
            "help_rc": helped.returncode,
            "help_lines": len(helped.stdout.splitlines()),
            "deploy_real_rc": bad.returncode,
            "timings_s": TIMINGS,
            "wheelhouse": json.loads((WHEELHOUSE / "wheelhouse.json").read_text())["total_bytes"],
            "problems": problems,
        }
        if REPORT.exists():
            shutil.copyfile(REPORT, CACHE / "report.json")
        evidence["total_s"] = round(time.monotonic() - started, 1)
        (CACHE / "evidence.json").write_text(json.dumps(evidence, indent=1) + "\n")
        print(json.dumps(evidence, indent=1))
    finally:
        server.terminate()
        server.wait(timeout=10)
        if os.environ.get("REAL_ENGINE_KEEP") != "1":
            step("10-lab-down", lab("down", "--inventory", INVENTORY / "hosts.yml"), check=False)
    if problems:
        print("real-engine: FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print("real-engine: OK: the real engine failed on the GPU-less host with its own error, reported, rolled back")
    return 0


def check_outcome(bad: subprocess.CompletedProcess, sim_release: str, engine_error: str) -> list[str]:
    """What the real-engine deploy must show: failure, the engine's error and phase, rollback, generation."""
    problems = []
    out = bad.stdout
    if bad.returncode == 0:
        problems.append("the real-engine deploy did not fail on a GPU-less host")
    if engine_error not in out:
        problems.append(f"the engine's own error ({engine_error}) is not in the Ansible output")
    if "ROLLED BACK: restored the last-known-good version" not in out:
        problems.append("no rollback in the Ansible output")
    if not REPORT.exists():
        return [*problems, f"no report {REPORT}"]
    report = json.loads(REPORT.read_text())
    if report.get("result") != "rolled_back":
        problems.append(f"report result {report.get('result')}, not rolled_back")
    failure = report.get("failure") or {}
    if failure.get("phase") != "start":
        problems.append(f"report failure phase {failure.get('phase')}, not start")
    if engine_error not in json.dumps(report):
        problems.append("the engine's own error is not in the report")
    rollback = report.get("rollback") or {}
    if not (rollback.get("performed") and rollback.get("healthy")):
        problems.append(f"rollback not performed and healthy: {rollback}")
    current = lab_exec("readlink", "-f", "/opt/ml-env/current").stdout.strip()
    if current != sim_release:
        problems.append(f"/opt/ml-env/current is {current}, not the last good {sim_release}")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    # the simulator thinks first (reasoning-parser glm45): as many tokens as the smoke prompt of the example
    body = json.dumps({"model": "glm-5", "messages": question, "max_tokens": 1024})
    answer = lab_exec(
        "curl", "-sS", "-m", "60", "-H", "Content-Type: application/json", "-d", body,
        "http://127.0.0.1:8000/v1/chat/completions",
    )  # fmt: skip
    (CACHE / "generation-after-rollback.json").write_text(answer.stdout + answer.stderr)
    if "Paris" not in answer.stdout:
        problems.append(f"no generation after the rollback: {answer.stdout[-300:]} {answer.stderr[-300:]}")
    return problems


if __name__ == "__main__":
    raise SystemExit(main())
