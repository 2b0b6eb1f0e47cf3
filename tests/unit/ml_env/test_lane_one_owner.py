"""The host's engine lane has one owner: ml_env's entry point `lane` (roles/ml_env/tasks/lane.yml, the fact
ml_env_lane). No other role or playbook derives it (the filter sglang_migrate_lane on the host's lock) or reads
ml_env's defaults for its default lock; upgrade_plan.yml's *target* lane (upgrade_plan_to) is not the host's."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OWNER = "roles/ml_env/tasks/lane.yml"


def _uses(pattern: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted([*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("roles/*/vars/*.yml"),
                        *REPO.glob("roles/*/defaults/*.yml"), *REPO.glob("playbooks/*.yml"),
                        *REPO.glob("playbooks/vars/*.yml")]):  # fmt: skip
        text = path.read_text().splitlines()
        lines = [ln for ln in text if re.search(pattern, ln) and not ln.lstrip().startswith("#")]
        if lines:
            found[str(path.relative_to(REPO))] = lines
    return found


def test_only_ml_env_derives_the_hosts_lane():
    uses = _uses(r"sglang_migrate_lane")
    assert set(uses) == {OWNER, "playbooks/upgrade_plan.yml"}, uses
    assert all("upgrade_plan_to" in line for line in uses["playbooks/upgrade_plan.yml"]), uses


def test_nobody_reads_ml_env_defaults_for_the_default_lock():
    assert _uses(r"ml_env/defaults/main\.yml") == {}


def test_the_readers_run_the_owners_entry_point_first():
    for reader in ("roles/sglang_server/tasks/flags.yml", "roles/rollout/tasks/plan_inputs.yml",
                   "playbooks/upgrade_plan.yml"):  # fmt: skip
        text = (REPO / reader).read_text()
        assert re.search(r"name: ml_env\n\s+tasks_from: lane\.yml", text), reader
