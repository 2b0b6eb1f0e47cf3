"""The quality gate's decision rule (docs/quality-gate.md, "The decision rule and its error rates"): Wald's sequential
probability ratio test on regressions, the items the trusted version answered right that the canary answers wrong.

Each item drawn is a regression with probability r. The test weighs H0: r = p0 (a healthy canary: the trusted
version's own run-to-run flips) against H1: r = p1 (a canary that lost p1 - p0 of its accuracy). After n items with
f regressions the log-likelihood ratio is (Wald 1945; ../reference facts copied into docs/quality-gate.md)

    L = f ln(p1/p0) + (n - f) ln((1 - p1)/(1 - p0))

and the test fails the canary at L >= ln((1 - beta)/alpha), passes it at L <= ln(beta/(1 - alpha)), and asks one more
item otherwise. At ``max_n`` items it stops: fail when L >= 0 (the regressions are nearer p1 than p0), else pass.
``operating`` computes the test's exact error rates with that truncation (a walk over every path of n and f), which
are what the documentation states; Wald's boundaries only bound them.

The gate runs one such test over all the items (a drop of ``drop`` in the regression rate) and one per item group (a
larger drop confined to that group, ``group_drop``): ``alpha`` is split between them (half to the overall test, the
other half evenly over the groups), so a healthy canary is rolled back at most ``alpha`` of the time (a union bound);
the overall test alone catches a uniform drop with probability at least ``1 - beta``. Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Sprt:
    """One sequential test of a regression rate: p0 (healthy) against p1 (degraded), error rates alpha (a healthy
    canary failed) and beta (a degraded one passed) by Wald's boundaries, truncated at ``max_n`` items."""

    p0: float
    p1: float
    alpha: float
    beta: float
    max_n: int

    @property
    def upper(self) -> float:
        return math.log((1 - self.beta) / self.alpha)

    @property
    def lower(self) -> float:
        return math.log(self.beta / (1 - self.alpha))

    @property
    def step_regression(self) -> float:
        return math.log(self.p1 / self.p0)

    @property
    def step_clean(self) -> float:
        return math.log((1 - self.p1) / (1 - self.p0))

    def llr(self, n: int, f: int) -> float:
        return f * self.step_regression + (n - f) * self.step_clean

    def decide(self, n: int, f: int) -> str | None:
        """``fail``, ``pass`` or None (ask another item) after ``n`` items with ``f`` regressions."""
        value = self.llr(n, f)
        if value >= self.upper - 1e-12:
            return "fail"
        if value <= self.lower + 1e-12:
            return "pass"
        if n >= self.max_n:
            return self.at_end(n, f)
        return None

    def at_end(self, n: int, f: int) -> str:
        """The verdict of a test stopped undecided (at its most items, or when the items ran out): ``fail`` when the
        regressions are nearer p1 than p0 (L >= 0), else ``pass`` (no item asked: pass)."""
        return "fail" if n and self.llr(n, f) >= 0 else "pass"

    def fewest_to_pass(self) -> int:
        """The fewest items after which the test can pass (all of them clean)."""
        for n in range(1, self.max_n + 1):
            if self.decide(n, 0) == "pass":
                return n
        return self.max_n

    def fewest_to_fail(self) -> int:
        """The fewest items after which the test can fail (all of them regressions)."""
        for n in range(1, self.max_n + 1):
            if self.decide(n, n) == "fail":
                return n
        return self.max_n

    def operating(self, r: float) -> dict:
        """The exact chance that the test fails a canary whose items regress with probability ``r`` independently,
        and the expected number of items it asks (``{fail, pass, expected_items}``)."""
        alive = {0: 1.0}  # regressions so far -> probability of having got here undecided
        fail = passed = expected = 0.0
        for n in range(1, self.max_n + 1):
            nxt: dict[int, float] = {}
            for f, prob in alive.items():
                for df, q in ((1, r), (0, 1 - r)):
                    if q <= 0:
                        continue
                    p = prob * q
                    verdict = self.decide(n, f + df)
                    if verdict == "fail":
                        fail += p
                        expected += n * p
                    elif verdict == "pass":
                        passed += p
                        expected += n * p
                    else:
                        nxt[f + df] = nxt.get(f + df, 0.0) + p
            alive = nxt
            if not alive:
                break
        return {"fail": fail, "pass": passed, "expected_items": expected}


@dataclass(frozen=True)
class GateSettings:
    """The gate's settings (the role's rollout_quality_gate_* variables): the healthy regression rate ``noise``, the
    uniform accuracy drop to catch ``drop``, the drop confined to one item group to catch ``group_drop``, the
    false-rollback rate ``alpha`` and the miss rate ``beta``, the most items of one run ``max_items``."""

    noise: float = 0.01
    drop: float = 0.05
    group_drop: float = 0.25
    alpha: float = 0.02
    beta: float = 0.04
    max_items: int = 240

    def overall(self) -> Sprt:
        return Sprt(self.noise, self.noise + self.drop, self.alpha / 2, self.beta, self.max_items)

    def group(self, groups: int, available: int | None = None) -> Sprt:
        """One group's test: its share of alpha; at most its share of ``max_items`` (round robin over ``groups``),
        or the items it has, when fewer."""
        most = math.ceil(self.max_items / max(1, groups))
        if available is not None:
            most = min(most, available)
        return Sprt(self.noise, self.noise + self.group_drop, self.alpha / 2 / max(1, groups), self.beta, most)

    def problems(self) -> list[str]:
        """What is out of range, each named by the option (module sglang_quality_eval's; the role's variables are
        rollout_quality_gate_<option>)."""
        out = []
        if not 0 < self.noise < 1:
            out.append(f"noise (a healthy canary's regression rate) must be in (0, 1), got {self.noise:g}")
        if not 0 < self.drop < 1 - self.noise:
            out.append(f"allowed_drop must be in (0, 1 - noise), got {self.drop:g}")
        if not 0 < self.group_drop < 1 - self.noise:
            out.append(f"group_drop must be in (0, 1 - noise), got {self.group_drop:g}")
        if not 0 < self.alpha < 0.5:
            out.append(f"false_rollback must be in (0, 0.5), got {self.alpha:g}")
        if not 0 < self.beta < 0.5:
            out.append(f"miss must be in (0, 0.5), got {self.beta:g}")
        if self.max_items < 1:
            out.append(f"max_items must be at least 1, got {self.max_items}")
        return out


# The group of an item that names none (an evaluation set of one group); "all" is the overall test's name
UNGROUPED = "items"


def group_of(item: dict) -> str:
    """The item group an item's answers are tested in."""
    return str(item.get("group") or UNGROUPED)


def available_by_group(items: list[dict], baseline: dict) -> dict[str, list[dict]]:
    """The items the baseline answered right, by group (in evaluation-set order): the gate's population."""
    right = {str(r.get("id")) for r in (baseline or {}).get("items", []) if r.get("ok")}
    out: dict[str, list[dict]] = {}
    for item in items:
        if str(item.get("id")) in right:
            out.setdefault(group_of(item), []).append(item)
    return out


def too_few(settings: GateSettings, by_group: dict[str, list[dict]]) -> list[str]:
    """Why the gate could never pass with these items (a group, or all of them, fewer than its test needs)."""
    out = []
    total = sum(len(v) for v in by_group.values())
    need = settings.overall().fewest_to_pass()
    if total < need:
        out.append(f"the baseline answered {total} items right; the gate needs at least {need} to pass")
    need = settings.group(len(by_group)).fewest_to_pass()
    for group, items in sorted(by_group.items()):
        if len(items) < need:
            out.append(f"group {group}: the baseline answered {len(items)} items right; its test needs {need}")
    return out


def draw_order(by_group: dict[str, list[dict]], rng) -> list[dict]:
    """Each group's items shuffled by ``rng`` (random.Random), then taken in turn, one group after another, so every
    prefix holds the groups about equally."""
    queues = {g: list(v) for g, v in sorted(by_group.items())}
    for g in queues:
        rng.shuffle(queues[g])
    out = []
    while any(queues.values()):
        for g in sorted(queues):
            if queues[g]:
                out.append(queues[g].pop())
    return out


class GateRun:
    """The sequential decision over answers fed in draw order (``add``): the overall test and one per group.
    ``verdict`` is None while undecided, ``fail`` as soon as any test fails, ``pass`` once every test passed."""

    def __init__(self, settings: GateSettings, by_group: dict[str, list[dict]]):
        self.settings = settings
        self.tests = {"all": settings.overall()}
        for group, items in by_group.items():
            self.tests[group] = settings.group(len(by_group), len(items))
        self.counts = {name: [0, 0] for name in self.tests}  # items, regressions (while the test runs)
        self.seen = {name: [0, 0] for name in self.tests}  # items, regressions (all answers fed)
        self.decided: dict[str, str] = {}
        self.verdict: str | None = None
        self.failed_by: str | None = None

    def wanted(self, group: str) -> bool:
        """Whether an item of ``group`` still tells a running test something."""
        return self.verdict is None and ("all" not in self.decided or group not in self.decided)

    def add(self, group: str, regression: bool) -> str | None:
        for name in ("all", group):
            self.seen[name][0] += 1
            self.seen[name][1] += int(regression)
            if name in self.decided:
                continue
            self.counts[name][0] += 1
            self.counts[name][1] += int(regression)
            verdict = self.tests[name].decide(*self.counts[name])
            if verdict:
                self.decided[name] = verdict
        if self.verdict is None:
            fails = [n for n, v in self.decided.items() if v == "fail"]
            if fails:
                self.verdict, self.failed_by = "fail", self._blame(fails)
            elif len(self.decided) == len(self.tests):
                self.verdict = "pass"
        return self.verdict

    def finish(self) -> str:
        """The verdict when the items ran out first: every undecided test decides by its truncation rule."""
        if self.verdict is None:
            for name, test in self.tests.items():
                if name not in self.decided:
                    self.decided[name] = test.at_end(*self.counts[name])
            fails = [n for n, v in self.decided.items() if v == "fail"]
            self.verdict = "fail" if fails else "pass"
            self.failed_by = self._blame(fails) if fails else None
        return self.verdict

    @staticmethod
    def _blame(fails: list[str]) -> str:
        """The test a failure is named after: a group's when one failed (the more specific), else the overall."""
        groups = [n for n in fails if n != "all"]
        return groups[0] if groups else "all"

    def summary(self) -> dict:
        return {
            name: {
                "items": self.seen[name][0],
                "regressions": self.seen[name][1],
                "decided_after": self.counts[name][0],
                "regressions_then": self.counts[name][1],
                "verdict": self.decided.get(name),
                "healthy_rate": self.tests[name].p0,
                "degraded_rate": round(self.tests[name].p1, 6),
                "alpha": round(self.tests[name].alpha, 6),
                "max_items": self.tests[name].max_n,
            }
            for name in self.tests
        }
