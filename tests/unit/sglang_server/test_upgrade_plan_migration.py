"""playbooks/upgrade_plan.yml run for real by ansible-playbook against an inventory whose hosts cannot be
reached (TEST-NET addresses over ssh): the plan reads only the inventory, so it must finish without contacting them.
It migrates the inventory's layers one by one (filter sglang_migrate_layers), so each change names the variable to
edit; it does not run the role's `flags` entry point (tests/unit/tools/test_tree_shape.py allows one playbook to).
And the sglang_server role's exact-flag check picks the argument table of the host's lane (vars/main.yml)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from role_flags import local_ansible_env, render  # tests/support

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = REPO / "playbooks" / "upgrade_plan.yml"
SEED_GPU_CLASS = yaml.safe_load(
    (REPO / "inventory/examples/glm5-rtxpro6000/group_vars/rtx_pro_6000/sglang_server.yml").read_text()
)["sglang_server_args_gpu_class"]
SEED_MODEL = yaml.safe_load(
    (REPO / "inventory/examples/glm5-rtxpro6000/group_vars/glm5/sglang_server.yml").read_text()
)["sglang_server_args_model"]


def inventory(tmp_path: Path, hosts: dict[str, dict]) -> Path:
    """sglang_servers with the seed's GLM-5 layers; each host unreachable (192.0.2.x, ssh, 1 s timeout)."""
    common = {"sglang_server_args_gpu_class": SEED_GPU_CLASS, "sglang_server_args_model": SEED_MODEL}
    doc = {"all": {"children": {"sglang_servers": {"hosts": {}, "vars": common}}}}
    for i, (name, host_vars) in enumerate(hosts.items(), start=1):
        doc["all"]["children"]["sglang_servers"]["hosts"][name] = {
            "ansible_host": f"192.0.2.{i}", "ansible_connection": "ssh", "ansible_timeout": 1, **host_vars,
        }  # fmt: skip
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def plan(tmp_path: Path, hosts: dict[str, dict], *extra: str) -> tuple[int, dict, str]:
    env = local_ansible_env(ANSIBLE_STDOUT_CALLBACK="json")
    hosts_file = inventory(tmp_path, hosts)
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(hosts_file), str(PLAYBOOK), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    doc, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("\n{") + 1 :])
    return proc.returncode, doc, proc.stdout + proc.stderr


def task(doc: dict, name: str) -> dict:
    return next(t for t in doc["plays"][0]["tasks"] if t["task"]["name"] == name)["hosts"]


def test_the_plan_shows_each_hosts_flags_on_the_cuda_13_lane_without_touching_a_host(tmp_path):
    rc, doc, out = plan(
        tmp_path, {"gpu-01": {"ml_env_lock": "sglang-cu128"}, "gpu-02": {}}, "-e", "upgrade_plan_to=sglang-cu130"
    )
    assert rc == 0, out[-3000:]
    assert doc["stats"]["gpu-01"]["unreachable"] == 0 and doc["stats"]["gpu-01"]["failures"] == 0
    shown = task(doc, "Show the plan")["gpu-01"]["msg"]
    assert shown[0] == "lane sglang-cu128 (sglang 0.5.9, CUDA 12.8) -> sglang-cu130 (sglang 0.5.23, CUDA 13.0)"
    # layer by layer: the seed's backends are in the GPU class's layer, the variable to edit
    assert shown[1:3] == ["sglang_server_args_gpu_class:", "- --nsa-decode-backend trtllm"]
    assert "- --enable-flashinfer-allreduce-fusion" in shown and "sglang_server_args_model:" not in shown
    assert any(line.startswith("+ --dsa-decode-backend trtllm  # NSA is called DSA") for line in shown)
    assert any(
        line.startswith("+ --flashinfer-allreduce-fusion-backend auto  # deprecated in 0.5.23") for line in shown
    )
    # a host without ml_env_lock is on ml_env's default lane: the same plan
    assert task(doc, "Show the plan")["gpu-02"]["msg"] == shown


def test_the_lab_lanes_are_the_simulators_declared_engine_versions(tmp_path):
    """locks/lab-sim and lab-sim-cu130 pin no sglang; their lock.yml's engine_version (what the simulator emulates
    there) and cuda_version make the lab's plan the production one's."""
    rc, doc, out = plan(tmp_path, {"gpu-01": {"ml_env_lock": "lab-sim"}}, "-e", "upgrade_plan_to=lab-sim-cu130")
    assert rc == 0, out[-3000:]
    shown = task(doc, "Show the plan")["gpu-01"]["msg"]
    assert shown[0] == "lane lab-sim (sglang 0.5.9, CUDA 12.8) -> lab-sim-cu130 (sglang 0.5.23, CUDA 13.0)"
    assert shown[1:3] == ["sglang_server_args_gpu_class:", "- --nsa-decode-backend trtllm"]
    assert any(line.startswith("+ --dsa-decode-backend trtllm  # NSA is called DSA") for line in shown)


def test_the_plan_back_to_the_cuda_12_step_changes_nothing(tmp_path):
    rc, doc, out = plan(tmp_path, {"gpu-01": {}}, "-e", "upgrade_plan_to=sglang-cu128-0.5.10")
    assert rc == 0, out[-3000:]
    assert task(doc, "Show the plan")["gpu-01"]["msg"][1:] == ["flags unchanged"]


def test_a_flag_without_a_mapping_fails_its_host_naming_the_option(tmp_path):
    hosts = {"gpu-01": {"sglang_server_args_host": {"enable-nan-detection": True}}, "gpu-02": {}}
    rc, doc, out = plan(tmp_path, hosts, "-e", "upgrade_plan_to=sglang-cu130")
    assert rc == 2
    failed = task(doc, "Refuse flags the target lane does not take (no migration rule maps them)")
    assert failed["gpu-01"]["failed"] is True and not failed["gpu-02"].get("failed")
    msg = failed["gpu-01"]["msg"]
    assert msg.startswith(
        "gpu-01: on lane sglang-cu130 (SGLang 0.5.23) these flags have no mapping: --enable-nan-detection"
    )
    assert "Fix: change or remove --enable-nan-detection in sglang_server_args_host (or add a rule" in msg
    assert doc["stats"]["gpu-01"]["unreachable"] == 0


@pytest.mark.parametrize(
    ("hosts", "extra", "message"),
    [
        ({"gpu-01": {}}, (), "upgrade_plan_to '' names no lock folder under "),
        ({"gpu-01": {}}, ("-e", "upgrade_plan_to=sglang-cu140"), "upgrade_plan_to 'sglang-cu140' names no lock folder"),
        ({"gpu-01": {}}, ("-e", "upgrade_plan_to=kernel-cu130"),
             'upgrade_plan_to "kernel-cu130" pins no sglang and its lock.yml declares no engine_version'),
        ({"gpu-01": {"ml_env_lock": "sglang-cu129"}}, ("-e", "upgrade_plan_to=sglang-cu130"),
         "gpu-01: ml_env_lock 'sglang-cu129' names no lock folder under "),
    ],
    ids=["no-target", "unknown-target", "target-pins-no-sglang", "unknown-current-lane"],
)  # fmt: skip
def test_bad_lanes_are_refused_naming_the_variable(tmp_path, hosts, extra, message):
    rc, doc, out = plan(tmp_path, hosts, *extra)
    assert rc == 2
    failures = [h["msg"] for t in doc["plays"][0]["tasks"] for h in t["hosts"].values() if h.get("failed")]
    assert len(failures) == 1 and message in failures[0], failures
    assert "sglang-cu128, sglang-cu128-0.5.10, sglang-cu130" in failures[0] or "pins no sglang" in failures[0]


# --- the role's exact-flag check reads the table of the host's lane (roles/sglang_server/vars/main.yml) ---

LANE_EXPR = "{{ _sglang_server_lane }}"


@pytest.mark.parametrize(
    ("extra", "lock", "table"),
    [({}, "sglang-cu128", "0.5.9"), ({"ml_env_lock": "sglang-cu130"}, "sglang-cu130", "0.5.23"),
     ({"ml_env_lock": "lab-sim"}, "lab-sim", "0.5.9"), ({"ml_env_lock": "lab-sim-cu130"}, "lab-sim-cu130", "0.5.23")],
)  # fmt: skip
def test_the_roles_lane_is_the_hosts_lock(tmp_path, extra, lock, table):
    lane = render(REPO / "inventory" / "lab" / "group_vars", "localhost", LANE_EXPR, extra, tmp_path)
    assert (lane["lock"], lane["table"], lane["problem"]) == (lock, table, "")


def test_the_roles_lane_refuses_an_unknown_lock_naming_ml_env_lock(tmp_path):
    """The flags entry point (ml_env's lane first) refuses the host, naming the variable and the fix."""
    with pytest.raises(AssertionError) as refused:
        render(REPO / "inventory" / "lab" / "group_vars", "localhost", LANE_EXPR, {"ml_env_lock": "nope"}, tmp_path)
    said = str(refused.value)
    assert "localhost: ml_env_lock 'nope' names no lock folder under " in said
    assert "`python locks/update_locks.py production --name nope`)" in said


def _exact_flag_check_vars() -> dict:
    """The exact-flag check as roles/sglang_server/tasks/validate_inputs.yml writes it (its task's own vars)."""
    tasks = yaml.safe_load((REPO / "roles/sglang_server/tasks/validate_inputs.yml").read_text())
    check = next(t for t in tasks if t["name"].startswith("Check the flags, the regexes"))
    return {k: check["vars"][k] for k in ("_sglang_server_in_args", "_sglang_server_in_flags")}


@pytest.mark.parametrize(
    ("lock", "refused"),
    [("sglang-cu128", []), ("lab-sim", []), ("sglang-cu130", ["--nsa-decode-backend", "--nsa-prefill-backend"])],
)
def test_validate_inputs_checks_the_flags_against_the_table_of_the_hosts_lane(tmp_path, lock, refused):
    """The seed's GLM-5 flags (0.5.9 spellings) pass on the CUDA 12.8 lane and the simulator's, and on the CUDA 13 lane
    are refused naming each option and the lane's table: what `deploy.yml` prints before any change."""
    hosts = inventory(tmp_path, {"gpu-01": {"ml_env_lock": lock}})
    problems = render(hosts, "gpu-01", "{{ _sglang_server_in_flags }}", _exact_flag_check_vars(), tmp_path)
    assert [p.split(" is not an option")[0] for p in problems] == refused
    for problem in problems:
        assert (
            "is not an option of SGLang 0.5.23 (the argument table of lane sglang-cu130); did you mean --dsa-"
            in problem
        )


def test_the_roles_lane_follows_ml_env_lock_dir_when_the_inventory_sets_it(tmp_path):
    """ml_env's other way to name a lock (a folder of its own): the lane is that folder's pinned sglang."""
    lock = tmp_path / "locks" / "my-cu130"
    lock.mkdir(parents=True)
    (lock / "lock.yml").write_text('name: my-cu130\ncuda_version: "13.0"\n')
    (lock / "requirements.in").write_text("sglang==0.5.23\n")
    lane = render(
        REPO / "inventory" / "lab" / "group_vars", "localhost", LANE_EXPR, {"ml_env_lock_dir": str(lock)}, tmp_path
    )
    assert (lane["lock"], lane["engine_version"], lane["table"], lane["problem"]) == (
        "my-cu130",
        "0.5.23",
        "0.5.23",
        "",
    )
    missing = {"ml_env_lock_dir": str(tmp_path / "locks" / "gone")}
    with pytest.raises(AssertionError) as refused:
        render(REPO / "inventory" / "lab" / "group_vars", "localhost", LANE_EXPR, missing, tmp_path)
    said = str(refused.value)
    assert "localhost: ml_env_lock_dir 'gone' names no lock folder under " + str(tmp_path / "locks") in said
