# gpufleet: the two commands that matter are `make deploy` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help
export GPUFLEET_ROOT := $(CURDIR)
export PYTHONPATH := $(CURDIR)/lab
export PATH := $(CURDIR)/.venv/bin:$(PATH)
# Tests and the lab never reach for the Hugging Face hub.
export HF_HUB_OFFLINE := 1
# Python keeps its bytecode caches here, whatever the calling shell says (PYTHONDONTWRITEBYTECODE=1 on our
# machines): make test starts thousands of Python processes (ansible-playbook and its workers, pytest, the lab
# tool, the simulated engines), and without the caches each of them compiles everything it imports again.
unexport PYTHONDONTWRITEBYTECODE

HOSTS ?= 2
# Gateway hosts (the router, group fleet_routers) of the lab.
ROUTERS ?= 1
# Of those, the ones that also run the monitor (group fleet_monitors: Prometheus, Alertmanager, the probe).
MONITORS ?= 1
PROFILE ?= rtx-pro-6000x8-vm
LAB ?= gpufleet
SUBNET ?=
SCENARIO ?=
# Molecule scenarios run at once (empty: tools/run_molecule.py picks two per core, at most 6).
MOLECULE_JOBS ?=
LAB_UP_ARGS = --name $(LAB) up --hosts $(HOSTS) --routers $(ROUTERS) --monitors $(MONITORS) --profile $(PROFILE) $(if $(SUBNET),--subnet $(SUBNET))

.PHONY: promtool sanity-venvs router-wheelhouse rulebook-wheelhouse real-engine help setup apt venv collections bench-client bench deploy lab-up lab-cuda-mirror lab-testhub lab-wheelhouse lab-down lab-status test lint unit lab-prune lab-tests lab-tests-1 lab-tests-2 molecule bench-lab real-kernel proxmox-demo

help:
	@echo "make deploy        set up this machine, bring up the default lab (2 hosts) and run deploy.yml on it"
	@echo "make test          lint + unit tests + lab tests + every Molecule scenario"
	@echo "make lab-up HOSTS=N [PROFILE=p1,p2] [LAB=name SUBNET=10.x.y.0/24] / make lab-down [LAB=name]"
	@echo "make molecule [SCENARIO=roles/<role>:default or molecule:<scenario>] [MOLECULE_JOBS=n]"
	@echo "make real-engine    the production lock (real SGLang 0.5.9) on a GPU-less lab host: must fail, roll back"
	@echo "make real-kernel   build a real CUDA torch extension (sm_90 + sm_120) with the ml_env kernel builder (~2.7 GB cached)"
	@echo "make bench-lab     time lab bring-up (2 and 8 hosts) and make test; saves JSON in benchmarks/results"
	@echo "make proxmox-demo  provision two GPU VMs on a simulated Proxmox VE (lab/pvesim) and read the inventory back"
	@echo "make bench         performance suite: no-op deploy (ansible.cfg vs defaults vs Mitogen), restart, env build"

setup: apt venv collections bench-client promtool

apt:
	@if ! command -v systemd-nspawn >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v iptables >/dev/null \
	    || ! command -v zstd >/dev/null || ! command -v chromium >/dev/null || ! command -v nft >/dev/null \
	    || ! command -v java >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    systemd-container mmdebstrap iptables nftables iproute2 zstd openssh-client curl openjdk-17-jre-headless \
	    >/dev/null \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; fi

venv:
	@command -v uv >/dev/null || python3 -m pip install --quiet uv
	uv sync --frozen --quiet --compile-bytecode

collections: venv
	.venv/bin/python tools/install_collections.py

# docs/proxmox.md, "A newcomer's path": pvesim on loopback, provision.yml with inventory/examples/proxmox/provision.yml,
# the inventory read back with cluster.proxmox.yml, pvesim stopped (tools/proxmox_demo.py).
proxmox-demo: venv collections
	.venv/bin/python tools/proxmox_demo.py

# The controller's benchmark client (sglang 0.5.9's bench_serving without its CUDA kernels) and the fleet report's
# plotting, from the hashed lock locks/bench-client (cached in .cache/bench-client). Headless Chromium (Debian,
# from `apt`) opens the fleet report in tests.
bench-client: venv
	.venv/bin/python tools/bench_client.py build >/dev/null

# promtool of Debian 12's prometheus package (2.42.0+ds), for the monitor's alert rules (lint, unit tests): the
# package is downloaded and unpacked into .cache/promtool, never installed (no Prometheus on the controller).
PROMTOOL ?= $(CURDIR)/.cache/promtool/bin/promtool
promtool:
	@python3 tools/promtool.py --check

# ansible-test sanity's own virtual environments (pylint, yamllint, voluptuous, ... as ansible-test pins them, from
# PyPI), made once into .cache/ansible-test so that `make lint` installs nothing (tools/ansible_test_sanity.py).
# `make test` makes them right after `setup`, before lint and the lab tests run side by side; not part of `setup`,
# which `make deploy` runs too (a user's deploy needs no test environment, and the documented-commands lab test runs
# `make deploy` while lint's sanity uses these environments).
sanity-venvs: venv collections
	.venv/bin/python tools/ansible_test_sanity.py --prime-venvs >/dev/null

deploy: setup lab-up lab-cuda-mirror lab-testhub lab-wheelhouse router-wheelhouse rulebook-wheelhouse
	ansible-playbook deploy.yml

lab-up: setup
	python -m gpufleet_lab $(LAB_UP_ARGS)

# The lab's signed apt mirror of CUDA 12.8 (lab equipment), served on the lab bridge for cuda_toolkit.
lab-cuda-mirror:
	python -m gpufleet_lab --name $(LAB) cuda-mirror up

# The lab's test hub (a tiny model behind the Hugging Face hub API; lab equipment) for model_weights.
lab-testhub:
	python -m gpufleet_lab --name $(LAB) testhub up

# The lab's ml-env wheelhouse on the controller (simulated engine wheel + PyYAML wheel, uv, small wheels) for ml_env.
lab-wheelhouse:
	.venv/bin/python locks/update_locks.py wheelhouse

# The router's wheelhouse on the controller (smg and its dependencies, hashes from locks/smg/requirements.txt).
router-wheelhouse:
	.venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	  --require-hashes -r locks/smg/requirements.txt -d .cache/smg/wheelhouse

# ansible-rulebook and the ansible-core it runs playbooks with, for the rulebook service's host (roles/fleet_rulebook).
rulebook-wheelhouse:
	.venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	  --require-hashes -r locks/rulebook/requirements.txt -d .cache/rulebook/wheelhouse

lab-down:
	python -m gpufleet_lab --name $(LAB) down

lab-status:
	python -m gpufleet_lab --name $(LAB) status

# Groups in order, stopping at the first that fails; the last line gives each group's time. The unit tests, the
# lab tests and Molecule run in one step: the lab tests leave about 40% of the CPU idle (waits for engines,
# drains, load), which Molecule takes at a lower priority (nice 10: its labs' processes inherit it), 2 scenarios
# at a time while the unit and lab tests run (MOLECULE_BESIDE), one more as each of those ends (2026-12-02: the
# unit tests end after about 14 minutes, the second half of the lab tests after 15, the first after 19), then
# MOLECULE_JOBS.
# The lab tests run as two halves at once (lab-tests-1, lab-tests-2: each test module has its own lab), so the
# longest group is no longer one chain of every lab test. Lint runs in the same step: alone it kept one of the
# two cores idle for a minute (ansible-lint uses about 1.25 cores), and a lint failure still fails the step.
# The test suite runs what users run: without the opt-in controller speed-ups (tools/ansible_speedups/env.sh, private
# ansible-core APIs; their own tests are tests/unit/tools/test_ansiballz_cache.py and test_fact_cache.py).
test:
	@NO_PRUNE=1 MOLECULE_NICE=10 MOLECULE_BESIDE=unit,lab-tests-1,lab-tests-2 MOLECULE_JOBS_BESIDE=2 \
	  python3 tools/timed_groups.py setup sanity-venvs lab-prune lint+unit+lab-tests-1+lab-tests-2+molecule

lint: promtool
	ruff check .
	ruff format --check .
	ansible-lint --profile production
	python tools/check_cited_results.py
	$(PROMTOOL) check rules roles/fleet_monitor/files/rules/*.yml
	python tools/ansible_test_sanity.py
	python tools/execution_environment.py

unit:
	pytest tests/unit --durations=30

lab-prune:
	python -m gpufleet_lab prune

# --durations: the slowest tests are printed, to see where make test's time goes.
# Under `make test` the one prune runs before the lab tests and Molecule run side by side (NO_PRUNE=1); the lab
# tool's own prune skips a lab whose `up` or `down` is under way (it holds the lab folder's lock).
lab-tests:
	$(if $(NO_PRUNE),,python -m gpufleet_lab prune)
	pytest tests/lab --durations=15

# The two halves of the lab tests that `make test` runs side by side (there, 2026-12-02: the rest 19 min, the
# fleet rollout and the lab tool's lifecycle tests 15-16 min; the monitoring scenario, about 7 min, joined the second).
# 2026-12-05: the engine upgrade (about 6 min) joined the second, the quality gate (about 4 min) the first; then
# (fresh clone: the first half 25.5 min, the second 30.7) the parallel bring-up test moved to the first.
# 2026-12-07: the monitoring scenario's fault test grew to 15 alerts, about 8 min of it (alone on this loaded machine:
# the module 19 min, 7 of them its bring-up); the halves were not measured again with it.
# 2026-12-07 (fresh clone on a loaded machine: the first half 81 min, the second 71): the liveness faults (about 8 min)
# joined the second. The quarantine (about 6 min) stays in the first.
LAB_TESTS_2 := tests/lab/test_rollout.py tests/lab/test_lab_lifecycle.py tests/lab/test_monitoring.py \
  tests/lab/test_engine_upgrade.py tests/lab/test_liveness.py
lab-tests-1:
	$(if $(NO_PRUNE),,python -m gpufleet_lab prune)
	pytest tests/lab $(addprefix --ignore=,$(LAB_TESTS_2)) --durations=30

lab-tests-2:
	$(if $(NO_PRUNE),,python -m gpufleet_lab prune)
	pytest $(LAB_TESTS_2) --durations=30

molecule:
	$(if $(NO_PRUNE),,python -m gpufleet_lab prune)
	$(if $(MOLECULE_NICE),nice -n $(MOLECULE_NICE)) .venv/bin/python tools/run_molecule.py \
	  $(if $(MOLECULE_JOBS),--jobs $(MOLECULE_JOBS)) $(SCENARIO)

bench-lab: setup
	.venv/bin/python benchmarks/bench_lab.py

# The project's own performance suite (not in `make test`; docs/performance.md): no-op server deploy with the
# project's ansible.cfg vs Ansible's defaults vs Mitogen, restart overhead (one lab host), and the production
# lock's env build uv vs pip from the local wheelhouse, and the fleet (no-op deploy.yml and rollout.yml on 1 and 8
# hosts, a real rollout's overhead per batch), the controller's variable computation per task and host with the
# fleet's facts (after fleet_rollout.py, which leaves them), and on the same lab a real rollout's overhead per batch
# with the whole machine on one core against two (rollout_cores.py). JSON in benchmarks/results/.
bench: setup
	.venv/bin/python benchmarks/suite/noop_and_restart.py
	.venv/bin/python benchmarks/suite/env_build_production.py
	.venv/bin/python benchmarks/suite/fleet_rollout.py --keep-lab && .venv/bin/python benchmarks/suite/get_vars_cost.py \
	  && .venv/bin/python benchmarks/suite/rollout_cores.py; \
	  status=$$?; .venv/bin/python -m gpufleet_lab --name perf-fleet down; exit $$status

# The real engine on the lab (not in `make test`: a 4.8 GiB wheelhouse, about 15 minutes): the production
# lock's ml-env from a cached controller wheelhouse on its own lab; the example inventory's flags must fail
# on the GPU-less host and roll back to the simulator. docs/lab.md "The real engine on the lab". Another engine lane:
# REAL_ENGINE_LANE=sglang-cu130 (its wheelhouse in /var/cache/gpufleet-lab/wheelhouse-<lane>, or REAL_ENGINE_WHEELHOUSE).
REAL_ENGINE_LANE ?= sglang-cu128
real-engine: setup
	REAL_ENGINE_LANE=$(REAL_ENGINE_LANE) .venv/bin/python tools/real_engine.py

# Not in `make test` (about 2.7 GB of cached wheels): the ml_env kernel builder compiles a real CUDA torch
# extension with nvcc + g++ for sm_90 and sm_120 on a lab host (CUDA 13.0 lane; docs/measurements/real-kernel-build.md).
REAL_KERNEL_CACHE ?= /var/cache/gpufleet-lab/real-kernel
# e.g. REAL_KERNEL_ARGS=--reuse (keep the built wheel: nothing compiles) or --keep-lab
REAL_KERNEL_ARGS ?=
real-kernel: setup
	REAL_KERNEL_CACHE=$(REAL_KERNEL_CACHE) .venv/bin/python lab/real_kernel/run.py $(REAL_KERNEL_ARGS)
