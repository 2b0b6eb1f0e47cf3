#!/usr/bin/env bash
# Real-GPU evidence for the gpu_facts role: raw nvidia-smi captures, the fact module's output, the
# derived settings and the NCCL all-reduce bandwidth (playbooks/measure_nccl.yml against localhost).
# Run from the repository root on a GPU machine with python3 + torch; writes into $1 (default ./evidence).
# ansible-core is taken from PYTHONPATH (the machine may have none: install the wheel first).
# Used for docs/measurements/h200-nccl.md; see that file for the exact invocation.
set -u
OUTDIR=$(realpath -m "${1:-evidence}")
PY=${PYTHON:-python3}
mkdir -p "$OUTDIR/raw"
# Keep NVLink multicast off (shared machines): NCCL, PyTorch symmetric memory, NVSHMEM.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# A minimal Ansible configuration (the project's ansible.cfg enables a callback from a collection).
printf '[defaults]\nroles_path = %s/roles\nfact_caching = jsonfile\nfact_caching_connection = %s%s/facts\ncallback_result_format = yaml\nhost_key_checking = false\n' \
  "$PWD" "" "$OUTDIR" >/tmp/evidence-ansible.cfg
export ANSIBLE_CONFIG=/tmp/evidence-ansible.cfg ANSIBLE_LOCALHOST_WARNING=false ANSIBLE_PYTHON_INTERPRETER="$(command -v "$PY")"

{
  echo "date: $(date -u +%FT%TZ)"; uname -a; nproc
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'
  "$PY" -c 'import ansible; print("ansible-core", ansible.__version__ if hasattr(ansible, "__version__") else "present")' 2>&1
  "$PY" -c 'import pynvml; print("pynvml", getattr(pynvml, "__version__", "present"))' 2>&1
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
} >"$OUTDIR/env.txt" 2>&1

# Raw outputs: the module's own command lines plus the wider views.
smi() { local name=$1; shift; { nvidia-smi "$@"; echo "# rc=$?"; } >"$OUTDIR/raw/$name" 2>&1; }
smi nvidia-smi.txt
smi nvidia-smi-q.txt -q
smi topo-m.txt topo -m
smi topo-mp.txt topo -mp
for m in r w n a p; do echo "## -p2p $m"; nvidia-smi topo -p2p $m; done >"$OUTDIR/raw/topo-p2p.txt" 2>&1
smi query-gpu-module.csv --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version,compute_cap,mig.mode.current,persistence_mode --format=csv,noheader,nounits
smi query-apps-module.csv --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits
smi nvlink.txt nvlink -s
{ systemd-detect-virt --vm; systemd-detect-virt --container; cat /sys/class/dmi/id/sys_vendor /sys/class/dmi/id/product_name; grep -m1 -o hypervisor /proc/cpuinfo; } >"$OUTDIR/raw/virt.txt" 2>&1
tar -C "$OUTDIR" -czf "$OUTDIR/raw.tar.gz" raw && rm -rf "$OUTDIR/raw"

# The fact module alone (with its raw outputs), as Ansible runs it.
ANSIBLE_LIBRARY=roles/gpu_facts/library ANSIBLE_MODULE_UTILS=roles/gpu_facts/module_utils \
  "$PY" -c 'from ansible.cli.adhoc import main; main()' -i localhost, -c local localhost -m gpu_facts \
  -a include_raw=true -t "$OUTDIR/tree" >"$OUTDIR/module-stdout.txt" 2>&1
mv "$OUTDIR/tree/localhost" "$OUTDIR/module-result.json" && rmdir "$OUTDIR/tree"

# Facts + derivation + measurement through the real playbook (derived first, then the alternatives).
printf 'sglang_servers:\n  hosts:\n    localhost:\n      ansible_connection: local\n' >/tmp/evidence-inventory.yml
"$PY" -c 'from ansible.cli.playbook import main; main()' -i /tmp/evidence-inventory.yml playbooks/measure_nccl.yml \
  -e "gpu_facts_ml_env_python=$(command -v "$PY")" -e "gpu_facts_report_dir=$OUTDIR/report" \
  -e '{"gpu_facts_nccl_base_env": {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}}' \
  -e '{"gpu_facts_nccl_warmup": 10, "gpu_facts_nccl_iters": 40}' \
  -e '{"gpu_facts_nccl_alternatives": {"defaults": {}, "seed": {"NCCL_P2P_LEVEL": "PHB", "NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "8", "NCCL_ALLOC_P2P_NET_LL_BUFFERS": "1"}, "p2p_level_phb": {"NCCL_P2P_LEVEL": "PHB"}, "p2p_off": {"NCCL_P2P_DISABLE": "1"}, "p2p_off_shm_off": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}}}' \
  >"$OUTDIR/playbook.log" 2>&1
echo "playbook rc=$?" >>"$OUTDIR/env.txt"

# Fallback when Ansible could not run: the benchmark directly (same variants).
if [ ! -s "$OUTDIR/report/localhost/nccl-allreduce.json" ]; then
  mkdir -p "$OUTDIR/report/localhost"
  "$PY" roles/gpu_facts/files/allreduce_bw.py --nccl-debug --warmup 10 --iters 40 --variant 'derived={}' \
    --variant 'defaults={}' --variant 'p2p_off={"NCCL_P2P_DISABLE":"1"}' \
    --json-out "$OUTDIR/report/localhost/nccl-allreduce.json" >/dev/null 2>>"$OUTDIR/env.txt"
fi
# One GPU: all-reduce between GPUs does not apply (status not_applicable).
CUDA_VISIBLE_DEVICES=0 "$PY" roles/gpu_facts/files/allreduce_bw.py --json-out "$OUTDIR/one-gpu.json" >/dev/null 2>&1
echo "one-gpu rc=$?" >>"$OUTDIR/env.txt"
ls -laR "$OUTDIR" >>"$OUTDIR/env.txt"
