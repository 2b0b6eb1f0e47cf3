"""LAB EQUIPMENT: the simulator's answers to the item shapes of the rollout's quality gate, and the
``partial-quality=SHARE`` fault (docs/quality-gate.md; lab/sglang-sim/README.md, "Quality: the oracle").

A real model answers "What is 347 + 589?" from its weights; the simulator has none, so it computes the answer
from the prompt (an oracle) for the shapes of the evaluation set roles/rollout/files/quality_eval/: arithmetic,
weekdays, date arithmetic, capitals (a table here), unit conversions and short word problems. This is a
deliberate difference from a model: a healthy simulated engine answers every such item right (score 1.0), so a
gate's baseline on the lab is 1.0 and only an injected fault lowers it:

* ``wrong-answer``: every computed answer is wrong (off by one, the next weekday, a day late, the wrong city);
* ``partial-quality=SHARE``: a deterministic share of them is wrong: an item is wrong when the first 8 hex digits
  of sha256 of its prompt, as a fraction of 2^32, are below SHARE; the same prompts every time, so a score is
  reproducible; its other answers, and every answer outside these shapes (the smoke check's capital of France),
  stay right: a silent quality loss that a one-prompt smoke check does not see;
* ``nan-output`` is textgen's (token 0 at every step, before any answer is computed).

The answers are bare (``936``, ``Friday``, ``Tokyo``), as a model asked to "reply with the number only" gives
them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import re

from .faults import Faults, FaultSource, from_env

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

# country -> (capital, what a degraded model says instead: the largest or best-known other city)
CAPITALS = {
    "japan": ("Tokyo", "Osaka"),
    "canada": ("Ottawa", "Toronto"),
    "australia": ("Canberra", "Sydney"),
    "brazil": ("Brasília", "Rio de Janeiro"),
    "kenya": ("Nairobi", "Mombasa"),
    "norway": ("Oslo", "Bergen"),
    "egypt": ("Cairo", "Alexandria"),
    "turkey": ("Ankara", "Istanbul"),
    "vietnam": ("Hanoi", "Ho Chi Minh City"),
    "switzerland": ("Bern", "Zurich"),
    "morocco": ("Rabat", "Casablanca"),
    "new zealand": ("Wellington", "Auckland"),
}

# "Convert V <from> to <to>": factor (or a function) from the first unit to the second
CONVERSIONS = {
    ("kilometers", "meters"): 1000.0,
    ("miles", "kilometers"): 1.609344,
    ("kilograms", "grams"): 1000.0,
    ("hours", "minutes"): 60.0,
    ("gibibytes", "mebibytes"): 1024.0,
    ("liters", "milliliters"): 1000.0,
    ("degrees fahrenheit", "degrees celsius"): lambda f: (f - 32.0) * 5.0 / 9.0,
    ("degrees celsius", "degrees fahrenheit"): lambda c: c * 9.0 / 5.0 + 32.0,
}

_NUM = r"(-?\d+(?:\.\d+)?)"
_DATE = r"(\d{4}-\d{2}-\d{2})"
_SHAPES = (
    ("arith", re.compile(rf"what is {_NUM} ([-+*]) {_NUM}\?")),
    ("weekday", re.compile(rf"what day of the week (?:was|is) {_DATE}\?")),
    ("days_after", re.compile(rf"what date is (\d+) days after {_DATE}\?")),
    ("capital", re.compile(r"what is the capital of ([a-z ]+)\?")),
    ("convert", re.compile(rf"convert {_NUM} ([a-z ]+?) to ([a-z ]+?)\.")),
    ("apples", re.compile(r"\w+ has (\d+) apples\. \w+ gives (\d+) to \w+ and then buys (\d+) more\.")),
    ("train", re.compile(rf"a train travels at {_NUM} km/h for {_NUM} hours\.")),
    ("older", re.compile(r"\w+ is (\d+) years older than \w+\. \w+ is (\d+) years old\.")),
    ("boxes", re.compile(r"a box holds (\d+) pencils\. how many boxes are needed for (\d+) pencils\?")),
)

_source: FaultSource | None = None


def current_faults() -> Faults:
    """The faults in force for this process: SGLANG_SIM_FAULT merged with SGLANG_SIM_FAULT_FILE (re-read when it
    changes), read quietly (the engine's own reader logs the changes)."""
    global _source
    if _source is None:
        _source = FaultSource(from_env(), quiet=True)
    return _source.current()


def degraded(prompt: str, share: float) -> bool:
    """Whether ``partial-quality=share`` makes this prompt's computed answer wrong (deterministic)."""
    if share <= 0:
        return False
    digest = hashlib.sha256(prompt.encode("utf-8", "replace")).hexdigest()
    return int(digest[:8], 16) / 2**32 < share


def _number(value: float) -> str:
    if math.isclose(value, round(value), abs_tol=1e-9):
        return str(int(round(value)))
    return f"{value:.4f}".rstrip("0").rstrip(".")


def _compute(shape: str, m: re.Match, wrong: bool) -> str | None:
    g = m.groups()
    if shape == "arith":
        a, op, b = float(g[0]), g[1], float(g[2])
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return _number(value + (1 if wrong else 0))
    if shape == "weekday":
        day = dt.date.fromisoformat(g[0]).weekday()
        return WEEKDAYS[(day + (1 if wrong else 0)) % 7]
    if shape == "days_after":
        date = dt.date.fromisoformat(g[1]) + dt.timedelta(days=int(g[0]) + (1 if wrong else 0))
        return date.isoformat()
    if shape == "capital":
        known = CAPITALS.get(g[0].strip())
        if known is None:
            return None
        return known[1] if wrong else known[0]
    if shape == "convert":
        rule = CONVERSIONS.get((g[1].strip(), g[2].strip()))
        if rule is None:
            return None
        value = rule(float(g[0])) if callable(rule) else float(g[0]) * rule
        return _number(value * (1.1 if wrong else 1.0))
    ints = [float(x) for x in g]
    value = {
        "apples": lambda: ints[0] - ints[1] + ints[2],
        "train": lambda: ints[0] * ints[1],
        "older": lambda: ints[0] + ints[1],
        "boxes": lambda: math.ceil(ints[1] / ints[0]),
    }[shape]()
    return _number(value + (1 if wrong else 0))


def oracle_answer(prompt: str, *, wrong: bool = False) -> str | None:
    """The computed answer to a prompt of one of the evaluation set's shapes, None for any other prompt.
    ``wrong`` (the ``wrong-answer`` fault), or the prompt falling in the ``partial-quality`` share, gives a
    plausible wrong answer instead."""
    text = " ".join(prompt.lower().split())
    for shape, rx in _SHAPES:
        m = rx.search(text)
        if m:
            bad = wrong or degraded(prompt, current_faults().partial_quality)
            try:
                return _compute(shape, m, bad)
            except (ValueError, OverflowError):
                return None
    return None
