"""inventory/examples/production-fleet: parses with its documented example vault password (and not
without it), its secrets come from the vault, the playbooks pass Ansible's syntax check against it, and the
multi-node server's flags are derived for both nodes from inventory order."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from role_flags import local_ansible_env, render_hosts

REPO = Path(__file__).resolve().parents[2]
INV = REPO / "inventory" / "examples" / "production-fleet"
PASSWORD = INV / "vault-password.example.txt"
BIN = REPO / ".venv" / "bin"
ENV = local_ansible_env(ANSIBLE_CALLBACK_RESULT_FORMAT="json")


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, check=False, timeout=120)


@pytest.fixture(scope="module")
def inventory() -> dict:
    proc = run(str(BIN / "ansible-inventory"), "-i", str(INV), "--list", "--vault-password-file", str(PASSWORD))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_groups_classes_router_and_multinode_server(inventory):
    assert sorted(inventory["rtx_pro_6000"]["hosts"]) == [f"rtxpro-0{i}" for i in range(1, 5)]
    assert sorted(inventory["h200"]["hosts"]) == [f"h200-0{i}" for i in range(1, 5)]
    assert inventory["glm5_h200_tp16"]["hosts"] == ["h200-03", "h200-04"]  # inventory order = node order
    assert inventory["fleet_routers"]["hosts"] == ["gateway-01"]  # the group playbooks/router.yml targets
    assert set(inventory["sglang_servers"]["children"]) >= {"rtx_pro_6000", "h200", "glm5", "glm5_h200_tp16"}


def test_secrets_only_in_the_encrypted_vault(inventory):
    vault = (INV / "group_vars" / "all" / "vault.yml").read_text()
    assert vault.startswith("$ANSIBLE_VAULT;1.1;AES256")
    hv = inventory["_meta"]["hostvars"]["rtxpro-01"]
    assert hv["sglang_server_api_key"] == "{{ vault_sglang_server_api_key }}"
    assert hv["vault_sglang_server_api_key"].startswith("example-api-key-")
    for path in INV.rglob("*.yml"):
        if path.name != "vault.yml":
            assert "example-api-key" not in path.read_text(), path
    gateway = inventory["_meta"]["hostvars"]["gateway-01"]  # the router role's own variable, from the vault
    assert gateway["fleet_router_control_plane_api_key"] == "{{ vault_fleet_router_control_plane_api_key }}"
    assert gateway["vault_fleet_router_control_plane_api_key"]
    refused = run(str(BIN / "ansible-inventory"), "-i", str(INV), "--list")
    assert refused.returncode != 0 and "vault" in refused.stderr.lower()


def test_playbooks_pass_the_syntax_check():
    proc = run(
        str(BIN / "ansible-playbook"), "-i", str(INV), "--vault-password-file", str(PASSWORD),
        "--syntax-check", "deploy.yml", "playbooks/restart.yml", "playbooks/rollback.yml", "playbooks/rollout.yml",
        "playbooks/bench.yml",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def rendered(tmp_path, *hosts: str) -> dict:
    """The merged flags, rank and nodes of each host, as the sglang_server role's `flags` entry point merges them."""
    expr = (
        "{{ {'argv': sglang_server_inventory_flags | gpufleet.fleet.sglang_argv, 'rank': sglang_server_node_rank | int,"
        " 'nodes': sglang_server_nodes, 'parallel': sglang_server_parallel,"
        " 'key_problem': sglang_server_api_key | gpufleet.fleet.sglang_api_key_problem} }}"
    )
    return render_hosts(INV, list(hosts), expr, {}, tmp_path, "--vault-password-file", str(PASSWORD))


def flag(argv: list[str], name: str):
    return argv[argv.index(name) + 1] if name in argv else None


def test_multinode_flags_from_inventory_order_and_single_node_untouched(tmp_path):
    r = rendered(tmp_path, "h200-03", "h200-04", "rtxpro-01")
    node0, node1, single = r["h200-03"], r["h200-04"], r["rtxpro-01"]
    for rank, r in enumerate((node0, node1)):
        assert r["nodes"] == ["h200-03", "h200-04"] and r["rank"] == rank
        assert flag(r["argv"], "--nnodes") == "2"
        assert flag(r["argv"], "--node-rank") == str(rank)
        assert flag(r["argv"], "--dist-init-addr") == "198.51.100.23:20000"
        assert flag(r["argv"], "--tp-size") == "16"
        # the one parallel layout every reader gets (the launch spec check, the unit)
        assert (r["parallel"]["nnodes"], r["parallel"]["world"], r["parallel"]["per_node"]) == (2, 16, 8)
    assert (single["parallel"]["nnodes"], single["parallel"]["per_node"]) == (1, 8)
    assert "--nnodes" not in single["argv"] and flag(single["argv"], "--tp-size") == "8"
    assert single["key_problem"] == ""  # the vault's key passes the role's API-key check


def test_the_router_gets_rank_0_of_the_multinode_server_only(tmp_path):
    expr = "{{ groups['sglang_servers'] | gpufleet.fleet.fleet_worker_urls(hostvars, 8000, groups) }}"
    urls = render_hosts(INV, ["rtxpro-01"], expr, {}, tmp_path, "--vault-password-file", str(PASSWORD))["rtxpro-01"]
    assert "h200-03" in urls and "h200-04" not in urls  # rank 1 serves no HTTP in SGLang
    assert sorted(urls) == ["h200-01", "h200-02", "h200-03", "rtxpro-01", "rtxpro-02", "rtxpro-03", "rtxpro-04"]


def test_a_rollout_over_the_multinode_server_is_refused_before_any_change():
    """The real playbook on the example inventory: refused in its first play, before it connects anywhere."""
    proc = run(
        str(BIN / "ansible-playbook"), "-i", str(INV), "--vault-password-file", str(PASSWORD), "playbooks/rollout.yml"
    )  # fmt: skip
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "rollout refused before any change: h200-03, h200-04 are one multi-node server" in out
    assert "playbooks/deploy_server.yml" in out and "changed=1" not in out and "unreachable=1" not in out
