"""Every address in the lab's group_vars is the lab's own gateway, so a lab on another subnet works.

The lab's inventory variables (inventory/lab/group_vars/gpufleet_lab/) are rendered by Ansible on a host of
a lab that is not the default one (its own /24, not 10.123.0.0/24), with facts gathered from that host.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, lab, lab_json

NAME = "t-gateway"
GROUP_VARS = ROOT / "inventory/lab/group_vars"
IPV4 = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")
RENDER = """
- name: Render the lab's group_vars on a lab host
  hosts: gpufleet_lab
  gather_facts: true
  gather_subset: [min, network]
  tasks:
    - name: Write them, rendered, to the controller
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ dict(names | zip(query('ansible.builtin.vars', *names))) | to_json }}"
        mode: "0644"
      delegate_to: localhost
"""


@pytest.fixture(scope="module")
def other_lab(tmp_path_factory):
    inv_dir = tmp_path_factory.mktemp("inv")
    # The lab's inventory beside the lab group_vars, as inventory/lab/ has them for the default lab.
    (inv_dir / "group_vars").symlink_to(GROUP_VARS)
    result = lab_json("--name", NAME, "up", "--hosts", "1", "--inventory", str(inv_dir / "hosts.yml"))
    yield result, inv_dir
    lab("--name", NAME, "down", check=False)


def lab_variable_names() -> list[str]:
    names = []
    for path in sorted((GROUP_VARS / "gpufleet_lab").glob("*.yml")):
        names += list((yaml.safe_load(path.read_text()) or {}).keys())
    return names


def test_every_lab_address_is_this_labs_gateway(other_lab, tmp_path):
    _, inv_dir = other_lab
    state = json.loads(Path(f"/var/lib/gpufleet-lab/{NAME}/state.json").read_text())
    subnet = ipaddress.ip_network(state["subnet"])
    gateway = str(next(subnet.hosts()))
    assert not subnet.overlaps(ipaddress.ip_network("10.123.0.0/24")), "the test needs a lab off the default subnet"
    playbook = tmp_path / "render.yml"
    playbook.write_text(RENDER)
    out = tmp_path / "rendered.json"
    names = lab_variable_names()
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inv_dir / "hosts.yml"), str(playbook),
         "-e", json.dumps({"out": str(out), "names": names})],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rendered = json.loads(out.read_text())
    assert sorted(rendered) == sorted(names)
    text = json.dumps(rendered)
    # 0.0.0.0 is a bind-to-all, not an address of the lab.
    addresses = {a for a in IPV4.findall(text) if a != "0.0.0.0"}
    assert addresses == {gateway}, f"lab {NAME} on {subnet}: addresses in its group_vars: {addresses}\n{text}"
    # The lab equipment's URLs: the hub (and its wheels) and the CUDA mirror all on this lab's gateway.
    assert rendered["model_weights_hf_endpoint"] == f"http://{gateway}:8490"
    assert rendered["model_weights_hf_pip_find_links"] == f"http://{gateway}:8490/wheels/"
    assert rendered["model_weights_hf_pip_trusted_host"] == gateway
    assert rendered["gpufleet_lab_cuda_mirror_url"] == f"http://{gateway}:8480"
