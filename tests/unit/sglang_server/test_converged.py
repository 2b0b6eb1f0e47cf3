"""The fast path of a no-op deploy.yml: what counts as an input, what the unit's closure holds (read from a real
`systemctl show` of a lab host's unit, systemd 252), the reasons a host is sent through every stage, and which
hosts the stages then run on."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import sglang_server_converged as module  # plugins/modules (tests/unit/conftest.py)
from ansible.errors import AnsibleActionFail
from ansible_collections.gpufleet.fleet.plugins.action import sglang_server_converged as action
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import show_properties

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "plugins" / "filter"))
from sglang_restart_plan import sglang_converged_summary, sglang_unconverged_hosts  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
SHOW = (REPO / "tests/unit/fixtures/systemd/show-sglang-server-lab.txt").read_text()
RELEASE = "/opt/ml-env/releases/a28a7bf89509d9bb"
MODEL = "/srv/models/gpufleet-lab--tiny-model/93e8c171601ec816319e60454f222900eb5c1d96"


KEY = b"k" * 32  # the controller's digest key in these tests


def inputs(**variables):
    digests = {k: action.value_digest(k, v, KEY) for k, v in variables.items()}
    return {"code": "c0de", "ansible": "2.19.14", "digest": action.key_id(KEY), "vars": digests}


def converged_record(closure, gpus, recorded_inputs):
    return {"schema": module.SCHEMA, "inputs": recorded_inputs, "unit": "sglang-server.service", "closure": closure,
            "gpus": gpus, "smoke": {"base_url": "http://127.0.0.1:8000"}, "node_rank": 0}  # fmt: skip


RUNNING = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"}
GPUS = [["0", "GPU-10c12817", "570.172.08"], ["1", "GPU-f3214a31", "570.172.08"]]


# --- the unit's closure, from systemd ------------------------------------------------------------------------------


def test_the_closure_names_every_path_the_real_unit_runs_with_and_no_cache():
    props = show_properties(SHOW)
    paths = module.exec_paths(props["ExecStart"])
    assert paths == [f"{RELEASE}/bin/python", "/usr/local/libexec/gpufleet/sglang-log-redact", f"{RELEASE}/bin/python",
                     MODEL]  # fmt: skip
    assert "/usr/local/cuda-12.8" in module.environment_paths(props["Environment"])
    closure = module.unit_closure(props)
    assert set(closure) == {
        "/etc/systemd/system/sglang-server.service",
        "/etc/sglang-server/secrets.env",
        f"{RELEASE}/bin/python",
        "/usr/local/libexec/gpufleet/sglang-log-redact",
        MODEL,
        "/usr/local/cuda-12.8",
        "/var/lib/sglang",
    }  # the caches of Environment (/var/cache/sglang-server/...) are written by the engine: never read
    assert all(state == {"type": "missing"} for state in closure.values())  # none of them exists on this machine


def test_exec_start_pre_and_flag_paths_count_and_runtime_files_do_not():
    value = ("{ path=/opt/r/bin/python ; argv[]=/opt/r/bin/python -I -c x /run/sglang-server/secret-args.yaml "
             "--config=/etc/extra.yaml ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; "
             "code=(null) ; status=0/0 }")  # fmt: skip
    props = {"ExecStartPre": value, "EnvironmentFiles": "/etc/a.env (ignore_errors=no)\n/etc/b.env (ignore_errors=yes)"}
    assert set(module.unit_closure(props)) == {"/opt/r/bin/python", "/etc/extra.yaml", "/etc/a.env", "/etc/b.env"}


def test_a_path_state_names_the_release_through_a_link_and_digests_files_and_trees(tmp_path):
    release = tmp_path / "releases" / "r1"
    (release / "bin").mkdir(parents=True)
    (release / "bin" / "python").write_text("#!python")
    (tmp_path / "current").symlink_to(release)
    state = module.path_state(str(tmp_path / "current" / "bin" / "python"))
    assert state["parent"] == str(release / "bin") and state["type"] == "file" and len(state["sha256"]) == 64
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    before = module.path_state(str(model))
    (model / "model.safetensors").write_bytes(b"\0" * 10)
    assert module.path_state(str(model))["tree"] != before["tree"] and before["entries"] == 1
    assert module.path_state(str(tmp_path / "nothing")) == {"type": "missing"}


# --- the reasons a host goes through every stage -------------------------------------------------------------------


def test_a_host_as_recorded_is_converged():
    now = inputs(sglang_server_args_host={"tp-size": 8})
    record = converged_record({"/u": {"type": "file", "sha256": "a"}}, GPUS, now)
    assert module.check(record, now, RUNNING, {"/u": {"type": "file", "sha256": "a"}}, GPUS) == []


def test_no_record_sends_the_host_through_every_stage():
    assert module.check({}, inputs(), RUNNING, {}, GPUS) == [
        "no record of a converged deploy (first deploy.yml, or the last one did not end healthy)"
    ]


def test_a_changed_variable_is_named_and_so_are_new_and_removed_ones():
    record = converged_record({}, GPUS, inputs(sglang_server_args_host={"tp-size": 8}, ml_env_lock="lab"))
    now = inputs(sglang_server_args_host={"tp-size": 4}, cuda_toolkit_version="12.9")
    reasons = module.check(record, now, RUNNING, {}, GPUS)
    assert reasons == [
        "variables changed since the last converged deploy: sglang_server_args_host",
        "variables set since the last converged deploy: cuda_toolkit_version",
        "variables no longer set since the last converged deploy: ml_env_lock",
    ]


def test_new_code_or_a_new_ansible_core_is_a_reason():
    record = converged_record({}, GPUS, inputs())
    now = dict(inputs(), code="beef", ansible="2.20.0")
    assert module.check(record, now, RUNNING, {}, GPUS) == [
        "gpufleet's code changed (roles, playbooks, plugins, templates or locks)",
        "ansible-core changed (2.19.14 -> 2.20.0)",
    ]


def test_a_stopped_unit_a_hand_edit_a_switched_release_and_other_gpus_are_each_named():
    unit = "/etc/systemd/system/sglang-server.service"
    py = "/opt/ml-env/current/bin/python"
    python = {"type": "file", "real": "/usr/bin/python3.11", "parent": "/opt/ml-env/releases/r1/bin", "sha256": "p"}
    recorded = {unit: {"type": "file", "sha256": "a"}, py: python}
    now = {unit: {"type": "file", "sha256": "b"}, py: dict(recorded[py], parent="/opt/ml-env/releases/r2/bin")}
    stopped = {"LoadState": "loaded", "ActiveState": "inactive", "SubState": "dead"}
    reasons = module.check(converged_record(recorded, GPUS, inputs()), inputs(), stopped, now, GPUS[:1])
    assert reasons == [
        "sglang-server.service is inactive/dead, not active/running",
        f"{unit} changed",
        f"{py} now lies in /opt/ml-env/releases/r2/bin (was /opt/ml-env/releases/r1/bin)",
        f"the GPUs differ from the record: {GPUS[:1]} (recorded {GPUS})",
    ]


def test_a_removed_file_and_a_silent_nvidia_smi_are_named():
    recorded = {"/etc/sglang-server/secrets.env": {"type": "file", "sha256": "a"}}
    now = {"/etc/sglang-server/secrets.env": {"type": "missing"}}
    reasons = module.check(converged_record(recorded, GPUS, inputs()), inputs(), RUNNING, now, None)
    assert reasons == ["/etc/sglang-server/secrets.env is missing", "nvidia-smi did not answer"]


def test_the_gpu_list_is_read_from_nvidia_smi_csv():
    def runner(argv, timeout=60):
        assert argv[1:] == ["--query-gpu=index,uuid,driver_version", "--format=csv,noheader"]
        return 0, "0, GPU-10c12817, 570.172.08\n1, GPU-f3214a31, 570.172.08\n", ""

    assert module.gpu_list("nvidia-smi", runner) == GPUS
    assert module.gpu_list("nvidia-smi", lambda argv, timeout=60: (127, "", "not found")) is None


# --- what is an input --------------------------------------------------------------------------------------------


def test_inputs_are_the_hosts_variables_not_ansibles_own_nor_facts_nor_the_switch_nor_the_rollouts_nor_molecules():
    variables = {
        "sglang_server_args_host": {"tp-size": 8},
        "ansible_host": "10.123.0.2",
        "ansible_facts": {"gpu_facts": {"count": 8}, "distribution": "Debian"},
        "gpu_facts": {"count": 8},
        "ansible_distribution": "Debian",
        "ansible_play_hosts": ["a"],
        "inventory_hostname": "a",
        "groups": {"all": ["a"]},
        "group_names": ["sglang_servers"],
        "sglang_server_converged_fast_path": True,
        "sglang_server_converged": {"converged": False},
        "rollout_serial": [1, "100%"],
        "sglang_server_serial": 8,
        "model_weights_revision": "{{ lab_revision }}",
        "molecule_file": "/tmp/molecule/e2e/molecule.yml",
    }

    def template(value):
        if value == "{{ lab_revision }}":
            raise ValueError("lab_revision is undefined")
        return value

    digests = action.input_digests(variables, template, "c0de", "2.19.14", KEY)
    assert set(digests["vars"]) == {"sglang_server_args_host", "ansible_host", "group_names", "model_weights_revision"}
    assert digests["vars"]["model_weights_revision"] == action.value_digest(
        "model_weights_revision", "{{ lab_revision }}", KEY
    )
    assert (digests["code"], digests["ansible"]) == ("c0de", "2.19.14")


def test_group_names_are_the_inventorys_not_the_groups_a_run_builds():
    # the first play of a deploy.yml sees the inventory's groups; the server stage that writes the record sees the
    # in-memory groups of its run too (sglang_server_restart_hosts, monitoring_validate_hosts, ...): same digest
    inventory = SimpleNamespace(
        _cached_dynamic_hosts=[
            {"host_name": "a", "groups": ["sglang_server_restart_hosts"], "host_vars": {}},
            {"host_name": "a", "groups": ["monitoring_validate_hosts"], "host_vars": {}},
        ],
        _cached_dynamic_grouping=[("a", {"add_group": "by_key", "parent_groups": ["by_parent"]})],
    )
    built = action.run_groups(inventory)
    assert built == {"sglang_server_restart_hosts", "monitoring_validate_hosts", "by_key", "by_parent"}
    first_play = {"group_names": ["gpufleet_lab", "sglang_servers"]}
    server_stage = {"group_names": ["gpufleet_lab", "monitoring_validate_hosts", "sglang_server_restart_hosts",
                                    "sglang_servers"]}  # fmt: skip
    check = action.input_digests(first_play, str, "c0de", "2.19.14", KEY, action.run_groups(SimpleNamespace()))
    record = action.input_digests(server_stage, str, "c0de", "2.19.14", KEY, built)
    assert check == record
    # an inventory group still counts
    moved = action.input_digests({"group_names": ["sglang_servers"]}, str, "c0de", "2.19.14", KEY, built)
    assert moved["vars"]["group_names"] != check["vars"]["group_names"]


def test_a_controller_file_named_by_an_input_counts_by_size_and_mtime(tmp_path):
    runfile = tmp_path / "cuda.run"
    runfile.write_text("one")
    before = action.value_digest("cuda_toolkit_runfile_url", str(runfile), KEY)
    runfile.write_text("two, longer")
    assert action.value_digest("cuda_toolkit_runfile_url", str(runfile), KEY) != before
    # a directory (a wheelhouse, the reports) is not read: what comes from it is pinned by a lock or a revision
    folder = tmp_path / "reports"
    folder.mkdir()
    empty = action.value_digest("sglang_server_report_dir", str(folder), KEY)
    (folder / "a.json").write_text("{}")
    assert action.value_digest("sglang_server_report_dir", str(folder), KEY) == empty


def test_the_code_digest_follows_any_file_of_the_collection_and_ignores_bytecode_and_molecule(tmp_path):
    (tmp_path / "roles/r/tasks").mkdir(parents=True)
    (tmp_path / "roles/r/tasks/main.yml").write_text("---\n")
    first = action.code_digest(str(tmp_path))
    (tmp_path / "roles/r/__pycache__").mkdir()
    (tmp_path / "roles/r/__pycache__/x.pyc").write_bytes(b"\0")
    assert action.code_digest(str(tmp_path)) == first
    # a Molecule scenario of the role building into its own folder while a no-op deploy runs beside it (CI once)
    (tmp_path / "roles/r/molecule/default/files/kernel/build").mkdir(parents=True)
    (tmp_path / "roles/r/molecule/default/files/kernel/build/lib.py").write_text("x = 1\n")
    assert action.code_digest(str(tmp_path)) == first
    (tmp_path / "roles/r/tasks/main.yml").write_text("---\n# changed\n")
    assert action.code_digest(str(tmp_path)) != first


def test_the_repository_code_digest_is_stable():
    assert action.code_digest(str(REPO)) == action.code_digest(str(REPO))


# --- which hosts the stages run on, and the renewed report ---------------------------------------------------------


def hv(converged, group=""):
    return {"sglang_server_converged": {"converged": converged}, "sglang_server_multinode_group": group}


def test_only_hosts_not_proven_go_through_the_stages_and_a_multinode_server_goes_whole():
    hostvars = {"a": hv(True), "b": hv(False), "m0": hv(True, "mn"), "m1": hv(False, "mn"), "n0": hv(True, "nn"),
                "n1": hv(True, "nn")}  # fmt: skip
    groups = {"mn": ["m0", "m1"], "nn": ["n0", "n1"]}
    assert sglang_unconverged_hosts(list(hostvars), hostvars, groups) == ["b", "m0", "m1"]


def test_a_host_never_checked_goes_through_the_stages():
    assert sglang_unconverged_hosts(["a"], {"a": {}}, {}) == ["a"]


def test_the_renewed_report_keeps_the_deploys_facts_and_renews_result_health_and_times():
    previous = {"schema": action.SCHEMA, "host": "h", "finished_at": "2026-12-02T01:00:00", "result": "ok",
                "restart_reasons": ["unit changed"], "restart": {"deploy": {}}, "flags": ["--tp-size", "8"],
                "versions": {"ml_env_release_id": "r1", "engine": "0.5.9-sim"},
                "engine_env": {"main_pid": 1}}  # fmt: skip
    health = {"ok": True, "health_status": 200, "models": ["glm-5"], "prompts": [{"ok": True}], "journal_errors": [],
              "failures": [], "engine_version": "0.5.9-sim", "simulator": True, "seconds": 1.5}  # fmt: skip
    report = action.renewed_report(previous, "h", {"main_pid": 42}, health, 1.9, "/var/lib/x.json")
    assert report["result"] == "unchanged" and report["restart_reasons"] == [] and report["restart"] == {}
    assert report["flags"] == ["--tp-size", "8"] and report["versions"]["ml_env_release_id"] == "r1"
    assert report["health"]["ok"] is True and report["health"]["checked_on"] == "h"
    assert report["engine_env"]["main_pid"] == 42 and report["timings"]["total_s"] == 1.9
    assert report["converged"] == {"fast_path": True, "record": "/var/lib/x.json",
                                   "last_full_deploy_at": "2026-12-02T01:00:00"}  # fmt: skip
    again = action.renewed_report(report, "h", {"main_pid": 42}, health, 1.8, "/var/lib/x.json")
    assert again["converged"]["last_full_deploy_at"] == "2026-12-02T01:00:00"


def test_one_summary_line_per_host_says_proven_in_place_or_why_every_stage_runs():
    hostvars = {
        "a": {"sglang_server_converged": {"converged": True, "health": {"seconds": 1.5}}},
        "b": {"sglang_server_converged": {"converged": False, "reasons": ["unit changed", "GPUs differ"]}},
        "m1": {"sglang_server_converged": {"converged": True, "health": {}}},
        "m2": {"sglang_server_converged": {"converged": True, "health": {}}},
    }
    assert sglang_converged_summary(["a", "b", "m1", "m2"], hostvars, ["b", "m2"]) == [
        "a: converged, proven in place by a generation (1.5 s); every stage skipped "
        "(sglang_server_converged_fast_path=false runs them)",
        "b: every stage runs: unit changed; GPUs differ",
        "m1: converged, proven in place (rank 0 answered for the server); every stage skipped "
        "(sglang_server_converged_fast_path=false runs them)",
        "m2: every stage runs: a node of its multi-node server differs",
    ]


def report_action(check_mode=False):
    plugin = object.__new__(action.ActionModule)
    plugin._task = SimpleNamespace(check_mode=check_mode)
    return plugin


def test_one_report_task_renews_every_converged_hosts_report_in_its_own_folder(tmp_path):
    health = {"ok": True, "health_status": 200, "seconds": 1.5}
    (tmp_path / "one").mkdir()
    (tmp_path / "one/a.json").write_text(json.dumps({"schema": action.SCHEMA, "host": "a", "result": "ok",
                                                     "flags": ["--tp-size", "8"]}))  # fmt: skip
    checks = {
        "a": {"report_dir": str(tmp_path / "one"), "health": health, "seconds": 1.6, "main_pid": 7},
        "b": {"report_dir": str(tmp_path / "two"), "health": health, "seconds": 1.7, "main_pid": 8},
    }
    result = report_action()._report({}, checks)
    assert result["reports"] == {
        "a": {"report": str(tmp_path / "one/a.json"), "result": "unchanged"},
        "b": {"report": str(tmp_path / "two/b.json"), "result": "unchanged"},
    }
    a = json.loads((tmp_path / "one/a.json").read_text())
    b = json.loads((tmp_path / "two/b.json").read_text())
    assert a["flags"] == ["--tp-size", "8"] and a["engine_env"]["main_pid"] == 7 and a["health"]["ok"] is True
    assert b["host"] == "b" and b["engine_env"]["main_pid"] == 8
    # --check writes nothing; a check without its folder is refused by name
    (tmp_path / "two/b.json").unlink()
    report_action(check_mode=True)._report({}, {"b": checks["b"]})
    assert not (tmp_path / "two/b.json").exists()
    with pytest.raises(AnsibleActionFail, match="the check of c names no report_dir"):
        report_action()._report({}, {"c": {"health": health}})


@pytest.mark.parametrize("mode", ["check", "record"])
def test_the_module_refuses_a_call_without_its_record_path(run_module, mode):
    result, failed = run_module("sglang_server_converged", {"mode": mode, "inputs": {}})
    assert failed and "record_path" in result["msg"]


def test_secrets_are_digested_with_a_key_that_stays_on_the_controller(tmp_path, monkeypatch):
    """The record on a server holds keyed digests (HMAC-SHA256 with the controller's random key, made once, mode
    0600): the digest of a weak secret is not the plain SHA-256 anyone could compute from a guess, and another key
    gives other digests."""
    import hashlib

    key_file = tmp_path / "gpufleet" / "converged-digest.key"
    monkeypatch.setenv(action.KEY_FILE_ENV, str(key_file))
    key = action.digest_key()
    assert len(key) == 32 and oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert action.digest_key() == key  # made once, then read
    secret = "password1"
    digest = action.value_digest("sglang_server_api_key", secret, key)
    blob = f"sglang_server_api_key\0{json.dumps(secret)}\0{{}}".encode()
    assert digest != hashlib.sha256(blob).hexdigest()[:20]  # the unkeyed digest of a guess does not match
    assert digest != action.value_digest("sglang_server_api_key", secret, b"o" * 32)
    assert secret not in json.dumps(action.input_digests({"sglang_server_api_key": secret}, str, "c", "a", key))


def test_a_record_keyed_by_another_controller_counts_every_input_as_changed():
    recorded = inputs(sglang_server_api_key="s3cret-one")
    now = {**inputs(sglang_server_api_key="s3cret-one"), "digest": action.key_id(b"o" * 32)}
    assert module.input_differences(recorded, now) == [
        "the record's input digests were made with another key (another controller, or a gpufleet before keyed "
        "digests): every input counts as changed"
    ]
    assert module.input_differences(recorded, inputs(sglang_server_api_key="s3cret-one")) == []
