"""Every Jinja filter of the collection is documented so that `ansible-doc -t filter gpufleet.fleet.<name>` shows it.

ansible-core reads a filter's documentation from ``plugins/filter/<name>.yml`` beside the plugin file (keys
DOCUMENTATION and RETURN as mappings, EXAMPLES as text), but only when the plugin file has no DOCUMENTATION of its
own: one in the ``.py`` shadows the sidecar files of every filter the file holds. The documented arguments are the
function's parameters: ``_input`` is the first (the piped value), ``positional`` names the others in order.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from role_flags import local_ansible_env  # tests/support

REPO = Path(__file__).resolve().parents[3]
FILTERS = REPO / "plugins" / "filter"
ANSIBLE_DOC = REPO / ".venv" / "bin" / "ansible-doc"
PACKAGE = "ansible_collections.gpufleet.fleet.plugins.filter"
needs_ansible_doc = pytest.mark.skipif(not ANSIBLE_DOC.exists(), reason="needs the project's venv (make venv)")

# Filters still without documentation. The test fails for any other undocumented filter, and for a name here that has
# its documentation now (take it off the list).
UNDOCUMENTED: set[str] = set()


def _load_filter_files() -> tuple[dict[str, dict], dict[str, str]]:
    """({filter name: {"file", "function"}}, {file: import error}) of every plugins/filter/*.py."""
    found: dict[str, dict] = {}
    broken: dict[str, str] = {}
    for path in sorted(FILTERS.glob("*.py")):
        try:
            module = importlib.import_module(f"{PACKAGE}.{path.stem}")
            filters = module.FilterModule().filters()
        except Exception as exc:  # a file that does not load is reported by its own test
            broken[path.name] = f"{type(exc).__name__}: {exc}"
            continue
        for name, function in filters.items():
            assert name not in found, f"filter {name} is defined by {found[name]['file']} and {path.name}"
            found[name] = {"file": path.name, "function": function}
    return found, broken


FOUND, BROKEN = _load_filter_files()
DOCUMENTED = sorted(set(FOUND) - UNDOCUMENTED)


def _parameters(function) -> list[str]:
    """The filter's parameter names, the piped value first. sglang_server.py's _wrap hides them behind
    (*args, **kwargs) and keeps the wrapped function's __name__, which names that function in its module."""
    function = inspect.unwrap(function)
    params = list(inspect.signature(function).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        inner = getattr(sys.modules[function.__module__], function.__name__, None)
        if callable(inner) and inner is not function:
            function = inner
            params = list(inspect.signature(inner).parameters.values())
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params), (
        f"cannot tell the parameters of {function.__name__}{inspect.signature(function)}"
    )
    return params


def _sidecar(name: str) -> dict:
    path = FILTERS / f"{name}.yml"
    assert path.is_file(), (
        f"filter {name} ({FOUND[name]['file']}) has no documentation: write plugins/filter/{name}.yml"
    )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        pytest.fail(f"plugins/filter/{name}.yml is not YAML: {err}")
    assert isinstance(data, dict), f"plugins/filter/{name}.yml is not a mapping"
    return data


def _positional(doc: dict) -> list[str]:
    value = doc.get("positional") or []
    return [p.strip() for p in value.split(",")] if isinstance(value, str) else list(value)


def _ansible_doc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ANSIBLE_DOC), "-t", "filter", *args],
        cwd=REPO, env=local_ansible_env(), capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_every_filter_file_loads():
    assert FOUND, "no filter found under plugins/filter"
    assert not BROKEN, f"filter files that do not load (Ansible skips them): {BROKEN}"


@pytest.mark.parametrize("name", DOCUMENTED)
def test_filter_is_documented_as_its_function_is(name):
    data = _sidecar(name)
    assert set(data) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, f"{name}.yml: top-level keys {sorted(data)}"
    doc, examples, returns = data["DOCUMENTATION"], data["EXAMPLES"], data["RETURN"]
    assert isinstance(doc, dict), f"{name}.yml: DOCUMENTATION must be a mapping (ansible-doc reads it as one)"
    assert doc.get("name") == name, f"{name}.yml documents {doc.get('name')!r}"
    assert str(doc.get("short_description") or "").strip(), f"{name}.yml: no short_description"
    assert doc.get("description"), f"{name}.yml: no description"
    assert isinstance(examples, str) and f"gpufleet.fleet.{name}" in examples, f"{name}.yml: no example by FQCN"
    assert isinstance(returns, dict) and (returns.get("_value") or {}).get("description"), f"{name}.yml: no _value"

    params = _parameters(FOUND[name]["function"])
    options = doc.get("options") or {}
    arguments = [p.name for p in params[1:]]
    assert list(options) == ["_input", *arguments], (
        f"{name}.yml options {list(options)}, the function takes {arguments}"
    )
    assert _positional(doc) == arguments, f"{name}.yml positional {_positional(doc)}, the function takes {arguments}"
    assert options["_input"].get("required") is True, f"{name}.yml: _input must be required"
    for param in params[1:]:
        option = options[param.name]
        assert option.get("description"), f"{name}.yml: option {param.name} has no description"
        if param.default is param.empty:
            assert option.get("required") is True, f"{name}.yml: {param.name} has no default, so it is required"
        else:
            assert not option.get("required"), f"{name}.yml: {param.name} has a default ({param.default!r})"
            if "default" in option:
                assert option["default"] == param.default, (
                    f"{name}.yml: {param.name} default {option['default']!r}, the function's is {param.default!r}"
                )


def test_the_undocumented_list_holds_only_undocumented_filters():
    documented_now = sorted(n for n in UNDOCUMENTED if (FILTERS / f"{n}.yml").exists())
    assert not documented_now, f"documented now, take them off UNDOCUMENTED: {documented_now}"


def test_no_filter_file_shadows_the_sidecar_docs():
    """ansible-doc takes a filter file's own DOCUMENTATION for every filter of the file, never the <name>.yml."""
    files = sorted({FOUND[n]["file"] for n in DOCUMENTED})
    shadowing = [
        f
        for f in files
        for node in ast.parse((FILTERS / f).read_text()).body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DOCUMENTATION" for t in node.targets)
    ]
    assert not shadowing, f"these filter files define DOCUMENTATION, which hides their filters' .yml: {shadowing}"


@needs_ansible_doc
def test_ansible_doc_shows_each_filter_from_its_yml():
    """One `ansible-doc --json` of every documented filter: each is found, from its own .yml."""
    proc = _ansible_doc("--json", *(f"gpufleet.fleet.{n}" for n in DOCUMENTED))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shown = json.loads(proc.stdout)
    wrong = {}
    for name in DOCUMENTED:
        doc = (shown.get(f"gpufleet.fleet.{name}") or {}).get("doc") or {}
        expected = _sidecar(name)["DOCUMENTATION"]["short_description"]
        if (
            doc.get("name") != name
            or not str(doc.get("filename", "")).endswith(f"/plugins/filter/{name}.yml")
            or doc.get("short_description") != expected
        ):
            wrong[name] = (doc.get("name"), doc.get("filename"), doc.get("short_description"))
    assert not wrong, f"ansible-doc does not show these filters' own .yml: {wrong}"


@needs_ansible_doc
@pytest.mark.parametrize("name", ["sglang_argv", "rollout_batches", "cuda_toolkit_driver_problem"])
def test_ansible_doc_prints_a_filter(name):
    # ansible-core 2.19's text output leaves the short description out; --json has it
    proc = _ansible_doc(f"gpufleet.fleet.{name}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header = proc.stdout.splitlines()[0]
    assert header.startswith(f"> FILTER gpufleet.fleet.{name} (") and header.endswith(f"/{name}.yml)"), header
    assert f"NAME: {name}" in proc.stdout
    as_json = _ansible_doc("--json", f"gpufleet.fleet.{name}")
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    short = _sidecar(name)["DOCUMENTATION"]["short_description"]
    assert json.loads(as_json.stdout)[f"gpufleet.fleet.{name}"]["doc"]["short_description"] == short


@needs_ansible_doc
def test_ansible_doc_lists_every_documented_filter():
    proc = _ansible_doc("-l", "gpufleet.fleet", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    listed = json.loads(proc.stdout)
    wrong = {
        name: listed.get(f"gpufleet.fleet.{name}")
        for name in DOCUMENTED
        if listed.get(f"gpufleet.fleet.{name}") != _sidecar(name)["DOCUMENTATION"]["short_description"]
    }
    assert not wrong, f"`ansible-doc -t filter -l gpufleet.fleet` lists these without their short description: {wrong}"
