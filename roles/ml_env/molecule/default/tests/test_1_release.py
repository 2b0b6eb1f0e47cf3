"""After converge: the lab-sim release is built from the shared wheelhouse, verified and current."""

import json
import re

import pytest

ROOT = "/opt/ml-env"
TAGS = {"ml-env-a": "cu12.8-cp311-sm120", "ml-env-b": "cu12.8-cp311-sm90"}


def release_of(host) -> str:
    assert host.file(f"{ROOT}/current").is_symlink, f"{ROOT}/current is not a link"
    return host.check_output(f"readlink {ROOT}/current")


def test_current_points_to_a_complete_release(host):
    target = release_of(host)
    assert re.fullmatch(rf"{ROOT}/releases/[0-9a-f]{{16}}", target), target
    marker = json.loads(host.file(f"{target}/.ml-env-release.json").content_string)
    assert marker["lock"] == "lab-sim"
    assert marker["id"] == target.rsplit("/", 1)[1]
    assert set(marker["modules"]) == {"sglang_sim", "gpufleet_lab_kernel"}


def test_release_runs_the_engine_from_the_lock(host):
    python = f"{ROOT}/current/bin/python"
    out = host.check_output(f"{python} -c 'import sglang_sim, gpufleet_lab_kernel, sys; print(sys.version_info[:2])'")
    assert out == "(3, 11)"
    assert host.run(f"{python} -m sglang_sim.launch_server --help").rc == 0
    # the simulator's dependency (--config), from the lock, in the release
    assert host.check_output(f"{python} -c 'import yaml; print(yaml.__version__)'") == "6.0.4"
    # exactly the lock (+ the kernel): nothing else in the venv
    freeze = host.check_output(f"{ROOT}/tools/uv-0.13.9/uv pip freeze --python {python}").split()
    assert sorted(freeze) == ["gpufleet-lab-kernel==0.1.0", "pyyaml==6.0.4", "sglang-sim==0.1.0"]


def test_the_release_brings_its_bytecode(host):
    """uv compiled the release when it installed it (ml_env_compile_bytecode): the server's user cannot write
    bytecode caches into the root-owned release, so without them every start compiles every import again."""
    python = f"{ROOT}/current/bin/python"
    site = host.check_output(f"{python} -c 'import os, sglang_sim; print(os.path.dirname(sglang_sim.__file__))'")
    for module in ("__init__", "launch_server", "scheduler"):
        cached = host.file(f"{site}/__pycache__/{module}.cpython-311.pyc")
        assert cached.is_file, f"{site}/{module}.py has no bytecode in the release ({cached.path} is missing)"
    assert host.run(f"runuser -u sglang -- test -w {site}/__pycache__").rc != 0, "the release is writable by sglang"


def test_uv_is_the_pinned_static_binary(host):
    assert host.check_output(f"{ROOT}/tools/uv-0.13.9/uv --version").startswith("uv 0.13.9")


def test_home_link(host):
    assert host.check_output("readlink /root/ml-env") == f"{ROOT}/current"


def test_kernel_tag_derived_from_gpu_facts_and_reused_not_built(host):
    name = host.backend.get_hostname()
    marker = json.loads(host.file(f"{release_of(host)}/.ml-env-release.json").content_string)
    assert marker["kernel_tag"] == TAGS[name]
    assert not host.file(f"{ROOT}/build").exists, "a kernel was built although its wheel was in the wheelhouse"
    assert host.file(f"{ROOT}/wheelhouse/kernels/{TAGS[name]}/gpufleet_lab_kernel-0.1.0-py3-none-any.whl").exists


@pytest.mark.parametrize("sub", ["flashinfer", "triton", "torchinductor", "cuda", "xdg", "huggingface"])
def test_cache_dirs_belong_to_the_service_user(host, sub):
    cache = host.file(f"/var/cache/sglang/{sub}")
    assert cache.is_directory
    assert (cache.user, cache.group, cache.mode) == ("sglang", "sglang", 0o750)


def test_service_user_is_a_system_account(host):
    user = host.user("sglang")
    assert user.exists and user.uid < 1000 and user.shell == "/usr/sbin/nologin"
    # it can use the release but not change it
    assert host.run(f"runuser -u sglang -- {ROOT}/current/bin/python -c 'import sglang_sim'").rc == 0
    assert host.run(f"runuser -u sglang -- touch {release_of(host)}/x").rc != 0
    assert host.check_output(f"find {release_of(host)} -perm -o+w ! -type l | wc -l") == "0"
