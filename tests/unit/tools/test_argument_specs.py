"""Generated over every role's meta/argument_specs.yml: every variable of every entry point, given a value of the
wrong type or out of range, is refused before any change, with a message naming the variable.

The cases are generated from the specs and from each role's meta/argument_ranges.yml (the ranges the spec cannot
express), so a new variable is covered without a new test; a variable no case can refuse (type raw without a
rule) fails the count. In-process, with Ansible's own code:

* types: ansible's ArgumentSpecValidator over the options of all entry points, as the first task of
  tasks/validate_inputs.yml (validate_argument_spec) runs it;
* strings and ranges: the second task's own Jinja, rendered by Ansible's Templar.

End to end (one ansible-playbook run, local connection, check mode, 15 hosts): per role, every wrong type at
once and every out-of-range value at once through the validate_inputs entry point, and one wrong type through the
main entry point: the first failing task is the first task run, nothing changed before it, every variable named.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from role_flags import local_ansible_env

ROOT = Path(__file__).resolve().parents[3]
# every role but fleet_common, whose validate_inputs entry point is the check itself (included by the others)
ROLES = sorted(
    p.parent.parent.name for p in (ROOT / "roles").glob("*/meta/argument_specs.yml") if "fleet_common" not in p.parts
)
RULE_KEYS = {"min", "max", "above", "below", "match", "is", "why"}
# The wrong value of each spec type that Ansible's validator refuses (str and path accept any scalar by
# conversion, so their wrong value is a mapping, refused by validate_inputs' second task).
WRONG_TYPE = {
    "int": "not-a-number",
    "float": "not-a-number",
    "bool": "maybe",
    "list": {"not": "a list"},
    "dict": "not-a-mapping",
    "str": {"not": "a string"},
    "path": {"not": "a string"},
}
SPEC_TYPES = {"int", "float", "bool", "list", "dict"}
# The name of the task Ansible puts first in a role included with tasks_from one of its declared entry points.
ENTRY_POINT_CHECK = "Validating arguments against arg spec '"


def options(role: str) -> dict:
    """The options of all entry points, merged as validate_inputs.yml merges them (combine, later wins)."""
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    merged: dict = {}
    for entry in specs.values():
        merged.update(entry.get("options") or {})
    return merged


def main_options(role: str) -> dict:
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return specs["main"].get("options") or {}


def ranges(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_ranges.yml").read_text()) or {}


def out_of_range(rule: dict) -> object:
    """A value of the right type that breaks the rule."""
    if rule.get("is") == "mapping":
        return ["not", "a", "mapping"]
    if rule.get("is") == "list":
        return "not-a-list"
    if "min" in rule:
        return rule["min"] - 1
    if "max" in rule:
        return rule["max"] + 1
    if "above" in rule:
        return rule["above"]
    if "below" in rule:
        return rule["below"]
    if "match" in rule:
        return "!nonsense!"
    raise AssertionError(f"rule {rule} has nothing to break")


def in_range(rule: dict) -> object:
    """A value on the boundary that the rule accepts (so the check is not a blanket refusal)."""
    if "min" in rule:
        return rule["min"]
    if "above" in rule:
        return rule["above"] + 0.5 if "below" not in rule else (rule["above"] + rule["below"]) / 2
    if "max" in rule:
        return rule["max"]
    if "below" in rule:
        return rule["below"] / 2
    if rule.get("is") == "mapping":
        return {}
    return []


def wrong_values(role: str) -> tuple[dict, dict]:
    """(spec-typed wrong values, wrong values only validate_inputs' second task can refuse)."""
    by_spec, by_task = {}, {}
    rules = ranges(role)
    for name, opt in options(role).items():
        kind = opt.get("type", "str")
        if opt.get("choices") and kind in ("str", "raw"):
            by_spec[name] = "not-one-of-the-choices"
        elif kind in SPEC_TYPES:
            by_spec[name] = WRONG_TYPE[kind]
        elif kind in ("str", "path"):
            # A secret's wrong value carries a marker that must never show in the message.
            by_task[name] = {"secret": f"s3cr3t-{name}"} if opt.get("no_log") else WRONG_TYPE[kind]
        elif name in rules:
            by_task[name] = out_of_range(rules[name])
    return by_spec, by_task


# ---- in process ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ansible_templating():
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar, trust_as_template
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    # ansible-core's collection finder, installed for these tests, stays on sys.meta_path: a later test module that
    # imports a module of this collection pytest imported without it (at collection) then fails with "collection
    # metadata was not loaded for collection gpufleet.fleet". Removed again at the end of this module's tests.
    init_plugin_loader()

    def trust(value):
        if isinstance(value, str):
            return trust_as_template(value)
        if isinstance(value, dict):
            return {k: trust(v) for k, v in value.items()}
        if isinstance(value, list):
            return [trust(v) for v in value]
        return value

    def problems(role: str, values: dict) -> str:
        """The second task of fleet_common's validate_inputs.yml, as the role's validate_inputs.yml includes it,
        rendered with its own vars over the role defaults."""
        task = yaml.safe_load((ROOT / "roles/fleet_common/tasks/validate_inputs.yml").read_text())[1]
        defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
        # The defaults stand for themselves (literal), the values under test override them.
        variables = {k: v for k, v in defaults.items() if not (isinstance(v, str) and "{{" in v)}
        variables.update(trust(task["vars"]))
        variables.update(values)
        variables["ansible_parent_role_paths"] = [str(ROOT / "roles" / role)]
        problems_var = next(k for k in task["vars"] if k.endswith("_problems"))
        templar = Templar(loader=DataLoader(), variables=variables)
        return templar.template(trust("{{ " + problems_var + " | default('', true) | trim }}"))

    yield problems
    _AnsibleCollectionFinder._remove()


def test_every_variable_of_every_role_is_refused_with_a_wrong_value(ansible_templating, capsys):
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    covered, uncovered, total = 0, [], 0
    for role in ROLES:
        opts = options(role)
        total += len(opts)
        by_spec, by_task = wrong_values(role)
        validator = ArgumentSpecValidator(opts)
        for name, value in by_spec.items():
            errors = validator.validate({name: value}, validate_role_argument_spec=True).error_messages
            named = [e for e in errors if re.search(rf"(?<![\w]){name}(?![\w])", e)]
            assert named, f"{role}: {name}={value!r} ({opts[name].get('type')}) is accepted by the argument spec"
        text = ansible_templating(role, by_task) if by_task else ""
        for name in by_task:
            assert f"{name} " in text or f"{name}=" in text, f"{role}: {name}={by_task[name]!r} not refused: {text}"
        for name in opts:
            if name in by_spec or name in by_task:
                covered += 1
            else:
                uncovered.append(f"{role}: {name} ({opts[name].get('type')})")
        for name in by_task:
            if opts[name].get("no_log"):
                assert f"s3cr3t-{name}" not in text, f"{role}: the value of the secret {name} is shown"
    with capsys.disabled():
        print(f"\nargument specs: {covered} of {total} variables of {len(ROLES)} roles refused with a wrong value")
    assert not uncovered, (
        "variables no wrong value can be generated for (type raw without a rule): add a rule to "
        f"meta/argument_ranges.yml: {uncovered}"
    )
    assert covered == total and total > 150


def test_ranges_refuse_outside_and_accept_the_boundary(ansible_templating):
    for role in ROLES:
        rules = ranges(role)
        if not rules:
            continue
        bad = {name: out_of_range(rule) for name, rule in rules.items()}
        text = ansible_templating(role, bad)
        for name in bad:
            assert f"{name}=" in text or f"{name} must" in text, f"{role}: {name}={bad[name]!r} not refused: {text}"
        good = {name: in_range(rule) for name, rule in rules.items() if "match" not in rule or "is" in rule}
        assert ansible_templating(role, good) == "", f"{role}: boundary values refused"


def test_range_tables_name_spec_variables_and_no_secret():
    for role in ROLES:
        opts = options(role)
        for name, rule in ranges(role).items():
            assert name in opts, f"roles/{role}/meta/argument_ranges.yml: {name} is not in the argument spec"
            assert set(rule) <= RULE_KEYS and "why" in rule, f"{role}: {name}: rule keys {sorted(rule)}"
            assert not opts[name].get("no_log"), f"{role}: {name} is a secret: its value would show in the message"


def test_validate_inputs_first_and_the_same_generic_checks_in_every_role():
    """Every role checks its inputs first, one way: its validate_inputs.yml starts by including fleet_common's
    (the spec check, then the ranges, read from the including role's meta/); the check is never pasted into a role."""
    common = yaml.safe_load((ROOT / "roles/fleet_common/tasks/validate_inputs.yml").read_text())
    assert "ansible.builtin.validate_argument_spec" in common[0] and "ansible.builtin.assert" in common[1]
    for role in ROLES:
        if role == "fleet_common":
            continue
        text = (ROOT / "roles" / role / "tasks" / "validate_inputs.yml").read_text()
        first = yaml.safe_load(text)[0]
        include = first.get("ansible.builtin.include_role", {})
        assert include.get("name") == "fleet_common" and include.get("tasks_from") == "validate_inputs", (
            f"{role}: validate_inputs starts with fleet_common's check"
        )
        # the rollout's settings are the run's: it checks them once (run_once), on the first host of its plan play
        assert first.get("run_once", False) is (role == "rollout"), f"{role}: run_once"
        assert include.get("apply", {}).get("run_once", False) is (role == "rollout"), f"{role}: run_once applied"
        assert "validate_argument_spec" not in text and "argument_ranges.yml')" not in text, f"{role}: pasted check"
    main_first = {
        role: yaml.safe_load((ROOT / "roles" / role / "tasks" / "main.yml").read_text())[0]
        for role in ROLES
        if role != "fleet_common"
    }
    for role, task in main_first.items():
        text = json.dumps(task)
        assert (
            "validate_inputs.yml" in text
            or (role == "ml_env" and "rollback" in text)
            or (role == "sglang_server" and "validate_and_prepare.yml" in text)
        ), f"{role}: tasks/main.yml must check its inputs first: {text}"
    # sglang_server: its first block starts the clock, then validates (validate.yml first, validate_inputs.yml first
    # in it) unless the host is a restart the plan play of the same run validated already.
    tasks_dir = ROOT / "roles" / "sglang_server" / "tasks"
    block = main_first["sglang_server"]["block"]
    assert "ansible.builtin.set_fact" in block[0]
    # two static includes, one skipped by its condition (no file name computed at run time)
    assert block[1]["ansible.builtin.include_tasks"] == "validate_and_prepare.yml"
    assert block[1]["when"] == "not sglang_server_restart_planned | bool"
    assert block[2]["ansible.builtin.include_tasks"] == "holders.yml"  # read again just before the stop
    assert block[2]["when"] == "sglang_server_restart_planned | bool"
    assert yaml.safe_load((tasks_dir / "validate_and_prepare.yml").read_text())[0]["ansible.builtin.import_tasks"] == (
        "validate.yml"
    )
    assert "validate_inputs.yml" in json.dumps(yaml.safe_load((tasks_dir / "validate.yml").read_text())[0])


# ---- end to end -------------------------------------------------------------------------------------------


# One play per host: include_role groups hosts by its untemplated arguments, so one templated include would
# run one host's role or entry point for another.
PLAY = """\
- name: Run {entry} of {role} on {host}
  hosts: {host}
  gather_facts: false
  tasks:
    - name: The entry point, refusal rescued (a play whose hosts all fail would end the run)
      block:
        - name: The entry point under test
          ansible.builtin.include_role:
            name: {role}
            tasks_from: {entry}
      rescue:
        - name: Refused
          ansible.builtin.debug:
            msg: refused
"""


def test_real_runs_refuse_at_the_first_task_naming_every_variable(tmp_path):
    hosts = {}
    expect = {}
    for role in ROLES:
        by_spec, by_task = wrong_values(role)
        common = {"test_role": role, "ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        if by_spec:
            hosts[f"{role}-types"] = {**common, "test_entry": "validate_inputs", **by_spec}
            expect[f"{role}-types"] = (by_spec, "validate_argument_spec")
        rules = ranges(role)
        task_bad = {**by_task, **{n: out_of_range(r) for n, r in rules.items()}}
        hosts[f"{role}-ranges"] = {**common, "test_entry": "validate_inputs", **task_bad}
        expect[f"{role}-ranges"] = (task_bad, "assert")
        main_typed = {n: WRONG_TYPE[o["type"]] for n, o in main_options(role).items() if o.get("type") in SPEC_TYPES}
        one = dict([next(iter(main_typed.items()))])
        hosts[f"{role}-main"] = {**common, "test_entry": "main", **one}
        expect[f"{role}-main"] = (one, "validate_argument_spec")
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    plays = [PLAY.format(host=h, role=v["test_role"], entry=v["test_entry"]) for h, v in hosts.items()]
    (tmp_path / "play.yml").write_text("".join(plays))
    # the project's ansible.cfg with the facts cached in memory (not its .cache/facts)
    env = local_ansible_env(
        ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_CALLBACKS_ENABLED="ansible.posix.json",
        ANSIBLE_FORKS="16",
    )
    bindir = Path(sys.executable).parent
    run = subprocess.run(
        [str(bindir / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), "--check", str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.strip(), run.stderr[-3000:]
    report = json.loads(run.stdout)
    stats = report["stats"]
    for host, (values, action) in expect.items():
        assert stats[host]["rescued"] == 1 and stats[host]["changed"] == 0, f"{host}: {stats[host]}"
        seen = []
        for play in report["plays"]:
            for task in play["tasks"]:
                result = task["hosts"].get(host)
                if result is None or result.get("skipped"):
                    continue
                seen.append((task["task"]["name"], result))
        failed = [(name, r) for name, r in seen if r.get("failed")]
        assert len(failed) == 1, f"{host}: {[n for n, _ in failed]}"
        name, result = failed[0]
        # Before the refusal only the include (and, for a range, the spec check that passed): nothing else ran.
        # (the include of fleet_common's check is the role's first task, not a change; so is Ansible's own check of
        # an entry point's arguments, the first task of a role included with tasks_from a declared entry point)
        before = [
            n
            for n, r in seen[: seen.index(failed[0])]
            if n not in ("The entry point under test", "Refused")
            and not n.endswith("(fleet_common)")
            and ENTRY_POINT_CHECK not in n
        ]
        if action == "validate_argument_spec":
            assert "argument_errors" in result, f"{host}: {name}: {result.get('msg')}"
            assert not before, f"{host}: tasks ran before the refusal: {before}"
        else:
            assert "assertion" in result and len(before) == 1, f"{host}: {name}; before it: {before}"
        message = str(result.get("msg", ""))
        missing = [v for v in values if v not in message]
        assert not missing, f"{host}: {name} does not name {missing}: {message[:2000]}"
