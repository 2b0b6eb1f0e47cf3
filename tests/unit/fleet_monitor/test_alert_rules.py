"""The monitor's alert rules (roles/fleet_monitor/files/rules/gpufleet-alerts.yml) against Debian 12's promtool
2.42 (tools/promtool.py: `apt-get download prometheus`, cached in .cache/promtool; never skipped: a controller
that cannot get promtool fails here).

* `promtool check rules` on the rules and the example thresholds files, `promtool test rules` on the *.test.yml
  beside this file (input series per alert, firing and not firing, with the rendered annotations);
* every test earns its place: with any one rule of the file removed, the tests fail (and name the removed alert);
* every alert carries a severity, a summary, a description and a runbook hint, and has a firing and a not-firing
  case; every gpufleet:* series the alerts read is recorded by the rules file or the thresholds file.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
RULES = REPO / "roles" / "fleet_monitor" / "files" / "rules" / "gpufleet-alerts.yml"
THRESHOLDS = sorted(HERE.glob("thresholds.*.yml"))
TESTS = sorted(HERE.glob("*.test.yml"))
SEVERITIES = {"critical", "warning", "none"}  # none: the heartbeat GpufleetWatchdog only (no person is paged)
# libyaml where PyYAML has it: the removal check loads and writes the files two dozen times
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
ANNOTATIONS = ("summary", "description", "runbook")

_spec = importlib.util.spec_from_file_location("gpufleet_promtool", REPO / "tools" / "promtool.py")
promtool_tool = importlib.util.module_from_spec(_spec)
sys.modules["gpufleet_promtool"] = promtool_tool
_spec.loader.exec_module(promtool_tool)


@pytest.fixture(scope="module")
def promtool() -> str:
    try:
        path = promtool_tool.ensure()
    except SystemExit as exc:  # the tool exits with its reason: fail, never skip
        pytest.fail(f"promtool could not be had (tools/promtool.py): {exc}")
    return str(path)


def _run(promtool: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, check=False, timeout=120)


@functools.cache
def _load(path: Path):
    return yaml.load(path.read_text(), Loader=LOADER)


def _rules() -> list[dict]:
    return [rule for group in _load(RULES)["groups"] for rule in group["rules"]]


def _alerts() -> list[dict]:
    return [rule for rule in _rules() if "alert" in rule]


def _name(rule: dict) -> str:
    return rule.get("alert") or rule["record"]


def test_the_files_are_there():
    assert TESTS, "no *.test.yml beside this file"
    assert any(p.name == "thresholds.example.yml" for p in THRESHOLDS)


def test_promtool_is_debian_12s(promtool):
    done = _run(promtool, "--version")
    assert done.returncode == 0, done.stderr
    assert "version 2.42.0" in (done.stdout + done.stderr), done.stdout + done.stderr


def test_promtool_is_fetched_once(promtool, monkeypatch):
    """A second call finds the cached binary and runs nothing (no apt-get, no dpkg-deb, no promtool)."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a cached promtool ran {args}")

    monkeypatch.setattr(promtool_tool.subprocess, "run", refuse)
    assert str(promtool_tool.ensure()) == promtool


def test_promtool_check_rules(promtool):
    done = _run(promtool, "check", "rules", RULES, *THRESHOLDS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout, done.stdout


def test_promtool_test_rules(promtool):
    done = _run(promtool, "test", "rules", *TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(TESTS), done.stdout


def _test_files_against(rules_file: Path, out: Path, alertnames: set[str] | None = None) -> list[Path]:
    """Copies of the test files in `out` whose rule_files name `rules_file` instead of gpufleet-alerts.yml (the
    others: absolute paths beside the originals). With `alertnames`, only the test cases (items of `tests`) that
    check one of those alerts, in the files that have some."""
    copies = []
    for test in TESTS:
        doc = copy.deepcopy(_load(test))
        if alertnames is not None:
            doc["tests"] = [
                case
                for case in doc["tests"]
                if any(check["alertname"] in alertnames for check in case.get("alert_rule_test", []))
            ]
            if not doc["tests"]:
                continue
        doc["rule_files"] = [
            str(rules_file) if Path(f).name == RULES.name else str((test.parent / f).resolve())
            for f in doc["rule_files"]
        ]
        path = out / test.name
        path.write_text(yaml.dump(doc, Dumper=DUMPER, sort_keys=False))
        copies.append(path)
    return copies


def _without(index: int | None, out: Path) -> Path:
    """The rules file with its index-th rule (counted over all groups) removed; None: every rule kept."""
    doc = copy.deepcopy(_load(RULES))
    seen = 0
    for group in doc["groups"]:
        kept = []
        for rule in group["rules"]:
            if seen != index:
                kept.append(rule)
            seen += 1
        group["rules"] = kept
    path = out / RULES.name
    path.write_text(yaml.dump(doc, Dumper=DUMPER, sort_keys=False))
    return path


def _readers(rule: dict) -> set[str]:
    """The alerts whose test cases must fail without `rule`: the alert itself, or for a recording rule the
    alerts whose expressions read its series."""
    if "alert" in rule:
        return {rule["alert"]}
    return {a["alert"] for a in _alerts() if re.search(re.escape(rule["record"]) + r"(?![a-z0-9_:])", a["expr"])}


def test_every_rule_earns_its_place(promtool, tmp_path):
    """For each rule, the tests fail without it. The copied tests are first proven to pass against the unchanged
    rules (so a failure is the removed rule's, not the copying's). Without a rule only the test cases of the alerts
    that need it run: their failure is the whole suite's, and it keeps this test fast."""
    rules = _rules()

    def run(index: int | None) -> tuple[str, int, str]:
        out = tmp_path / ("baseline" if index is None else f"without-{index:02d}")
        out.mkdir()
        readers = None if index is None else _readers(rules[index])
        copies = _test_files_against(_without(index, out), out, readers)
        if not copies:
            return _name(rules[index]), -1, f"no test case checks {sorted(readers)}"
        done = _run(promtool, "test", "rules", *copies)
        return ("baseline" if index is None else _name(rules[index])), done.returncode, done.stdout + done.stderr

    with ThreadPoolExecutor(max_workers=4) as pool:
        baseline, *results = pool.map(run, [None, *range(len(rules))])
    assert baseline[1] == 0, "the copied tests fail with every rule in place:\n" + baseline[2]
    unearned = [name for name, rc, _ in results if rc == 0]
    assert not unearned, f"the tests still pass with these rules removed (untested): {unearned}"
    assert not [out for _, rc, out in results if rc == -1], [out for _, rc, out in results if rc == -1]
    for (name, _rc, output), rule in zip(results, rules, strict=True):
        for alert in _readers(rule):
            assert f"alertname: {alert}," in output, f"removing {name} did not fail the tests of {alert}:\n{output}"


@pytest.mark.parametrize("rule", _alerts(), ids=_name)
def test_alert_has_severity_summary_description_runbook(rule):
    assert re.fullmatch(r"Gpufleet(?:[A-Z][A-Za-z0-9]*)+", rule["alert"]), rule["alert"]
    assert rule.get("labels", {}).get("severity") in SEVERITIES, rule.get("labels")
    assert (rule["labels"]["severity"] == "none") == (rule["alert"] == "GpufleetWatchdog"), rule["alert"]
    for key in ANNOTATIONS:
        text = rule.get("annotations", {}).get(key, "")
        assert text.strip(), f"{rule['alert']}: no {key} annotation"
    # the host (or gateway) the alert is about, in words; the contract alert names a class or a model
    assert re.search(r"\$labels\.(instance|gpu_class|model)", rule["annotations"]["summary"])
    # and the value that fired it (the contract alert's value is a constant 1)
    assert "$value" in rule["annotations"]["description"] or rule["alert"] == "GpufleetThresholdMissing"


def _alert_cases() -> dict[str, dict[str, int]]:
    cases: dict[str, dict[str, int]] = {}
    for test in TESTS:
        for case in _load(test)["tests"]:
            for check in case.get("alert_rule_test", []):
                kind = "firing" if check.get("exp_alerts") else "silent"
                counts = cases.setdefault(check["alertname"], {"firing": 0, "silent": 0})
                counts[kind] += 1
    return cases


def test_every_alert_has_a_firing_and_a_silent_case():
    cases = _alert_cases()
    names = {rule["alert"] for rule in _alerts()}
    assert set(cases) <= names, f"tests of alerts that do not exist: {set(cases) - names}"
    for name in sorted(names):
        counts = cases.get(name, {"firing": 0, "silent": 0})
        assert counts["firing"] and counts["silent"], f"{name}: {counts} (need a firing and a not-firing case)"


def _recorded(path: Path) -> set[str]:
    groups = _load(path)["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


@pytest.mark.parametrize("thresholds", THRESHOLDS, ids=lambda p: p.name)
def test_thresholds_files_record_what_the_alerts_read(thresholds):
    read = {m for rule in _rules() for m in re.findall(r"gpufleet:[a-z0-9_:]+", rule["expr"])}
    recorded = _recorded(thresholds) | _recorded(RULES)
    assert read - recorded == set(), f"{thresholds.name} lacks {sorted(read - recorded)}"
    # only constant recording rules, one label each: what the inventory's template renders
    for group in _load(thresholds)["groups"]:
        for rule in group["rules"]:
            assert re.fullmatch(r"vector\([0-9.]+\)", rule["expr"]), rule
            keys = set(rule.get("labels", {}))
            if rule["record"] == "gpufleet:router_worker_info":
                assert keys == {"worker", "model", "host"}, rule
            elif rule["record"].startswith("gpufleet:router_"):
                assert keys == {"model"}, rule
            else:
                assert keys == {"gpu_class"}, rule
