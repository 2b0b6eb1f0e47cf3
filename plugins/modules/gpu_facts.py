#!/usr/bin/python
"""Ansible module gpu_facts: NVIDIA GPUs, topology and peer-to-peer status as facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU, topology, peer-to-peer and virtualization facts
description:
  - Runs C(nvidia-smi) on the target (CSV queries of GPUs and compute processes, C(topo -m),
    C(topo -p2p r), the summary banner) and returns one structured fact, C(ansible_facts.gpu_facts).
  - Where the Python package C(pynvml) (nvidia-ml-py) is importable by the module's interpreter,
    NVML's peer-to-peer read status is gathered as a second source and compared with nvidia-smi's.
  - Virtualization comes from C(systemd-detect-virt) (VM and container), else DMI, else the
    C(hypervisor) CPU flag.
  - Reads only; never changes the host. Supports check mode.
  - Fails with the command, its exit code, what it printed and an explanation when the NVIDIA
    driver is missing or not loaded (unless O(fail_on_missing_driver=false)).
version_added: "0.1.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  nvidia_smi:
    description: The nvidia-smi executable (name or path).
    type: str
    default: nvidia-smi
  use_nvml:
    description: Also read the peer-to-peer matrix through C(pynvml) when it can be imported.
    type: bool
    default: true
  disk_paths:
    description: Paths whose free disk space is reported (the nearest existing parent is measured).
    type: list
    elements: str
    default: []
  fail_on_missing_driver:
    description:
      - When false, a host without a working driver returns C(gpu_facts.driver_loaded=false) and
        C(gpu_facts.error) instead of failing.
    type: bool
    default: true
  include_raw:
    description: Also return the raw outputs of the nvidia-smi commands as C(raw) (for captures).
    type: bool
    default: false
notes:
  - Facts schema and the derivations built on it are documented in docs/gpu-facts.md.
seealso:
  - name: gpu_comm_settings filter
    description: Derives the NCCL environment and SGLang communication flags from these facts.
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpu_facts:
    disk_paths: [/opt/ml-env, /srv/models]

- name: Show the P2P status
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu_facts.p2p.statuses }} over {{ ansible_facts.gpu_facts.topology.link_types }}"

- name: Inventory a fleet that may include hosts without a driver
  gpu_facts:
    fail_on_missing_driver: false
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    gpu_facts:
      description:
        - GPUs, topology and P2P of the host. Keys (see docs/gpu-facts.md for every field)
          schema_version, sources, driver_loaded, driver_version, cuda_driver_version, gpu_count,
          gpus (index, name, uuid, pci_bus_id, memory_total_mib, memory_used_mib, memory_free_mib,
          compute_cap, arch, mig_mode, persistence_mode, numa_affinity, cpu_affinity), models,
          archs, compute_caps, mixed_models, mig_enabled, memory_total_mib_min, topology
          (matrix, pairs, link_types, nvlink_all, nvlink_any, worst_link, worst_pcie_link,
          numa_nodes, nics), p2p (mode, matrix, statuses, all_ok, any_ok, missing_gpus,
          not_ok_pairs, nvml, nvml_agrees), processes (pid, name, used_memory_mib, gpu_index,
          gpu_uuid, unit, alive, uid, user, cmdline with secret values masked), busy_gpus,
          virtualization (vm, container, is_vm, method), disk.
      returned: always
      type: dict
      sample:
        driver_version: "570.172.08"
        gpu_count: 8
        archs: [sm_120]
        topology: {link_types: [PHB], nvlink_all: false, worst_link: PHB}
        p2p: {statuses: [NS], all_ok: false}
        virtualization: {vm: kvm, is_vm: true}
raw:
  description: Raw stdout of each nvidia-smi command, by key (query_gpu, topo_m, topo_p2p_r, query_apps, summary).
  returned: when include_raw is true
  type: dict
commands:
  description: The command lines the facts were read from, by key.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpu_facts_collect import GpuFactsError, collect, commands


def main():
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "use_nvml": {"type": "bool", "default": True},
            "disk_paths": {"type": "list", "elements": "str", "default": []},
            "fail_on_missing_driver": {"type": "bool", "default": True},
            "include_raw": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    smi = params["nvidia_smi"]
    cmds = commands(smi)

    def run(argv):
        if module.get_bin_path(argv[0]) is None:
            return 127, "", f"{argv[0]}: command not found"
        return module.run_command(argv, check_rc=False, environ_update={"LC_ALL": "C"})

    try:
        facts, raw = collect(run, nvidia_smi=smi, use_nvml=params["use_nvml"], disk_paths=params["disk_paths"])
    except GpuFactsError as exc:
        if params["fail_on_missing_driver"]:
            module.fail_json(
                msg=f"gpu_facts: {exc}",
                cmd=" ".join(exc.cmd or []),
                rc=exc.rc,
                stdout=exc.stdout,
                stderr=exc.stderr,
                commands=cmds,
            )
        facts = {"schema_version": 1, "driver_loaded": False, "error": str(exc), "gpu_count": 0, "gpus": []}
        raw = {}
    result = {"changed": False, "ansible_facts": {"gpu_facts": facts}, "commands": cmds}
    if params["include_raw"]:
        result["raw"] = raw
    module.exit_json(**result)


if __name__ == "__main__":
    main()
