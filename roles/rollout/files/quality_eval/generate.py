"""Write the rollout quality gate's evaluation set, gpufleet-eval-v1.json, next to this file (docs/quality-gate.md).

Written by us, no third-party data: generated arithmetic, weekdays and date arithmetic (a fixed random seed), capitals,
unit conversions and short word problems, each with a prompt that asks for a short answer and an exact answer
(matcher ``exact``: the normalised text, or ``numeric``: the answer's last number). Deterministic: running it again
writes the same bytes (tests/unit/rollout/test_quality_eval.py checks the file against it).

    python roles/rollout/files/quality_eval/generate.py [--check]
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "gpufleet-eval-v1.json"
SEED = 20261205
NUMBER = "Reply with the number only."
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
CAPITALS = (
    ("Japan", "Tokyo", []),
    ("Canada", "Ottawa", []),
    ("Australia", "Canberra", []),
    ("Brazil", "Brasília", ["Brasilia"]),
    ("Kenya", "Nairobi", []),
    ("Norway", "Oslo", []),
    ("Turkey", "Ankara", []),
    ("New Zealand", "Wellington", []),
)
CONVERSIONS = (
    ("3.5", "kilometers", "meters", 3500, 0),
    ("26.2", "miles", "kilometers", 42.165, 0.01),
    ("2.75", "kilograms", "grams", 2750, 0),
    ("4.5", "hours", "minutes", 270, 0),
    ("212", "degrees Fahrenheit", "degrees Celsius", 100, 0.01),
    ("16", "gibibytes", "mebibytes", 16384, 0),
)


def items() -> list[dict]:
    rng = random.Random(SEED)
    out: list[dict] = []

    def add(kind, prompt, expected, match="numeric", **extra):
        out.append({"id": f"{kind}-{sum(1 for i in out if i['id'].startswith(kind + '-')) + 1:02d}",
                    "prompt": prompt, "expected": expected, "match": match, **extra})  # fmt: skip

    for op in "+-*+-*+*":
        a, b = rng.randint(12, 999), rng.randint(12, 999)
        if op == "-" and b > a:
            a, b = b, a
        if op == "*":
            b = rng.randint(3, 99)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        add("arith", f"What is {a} {op} {b}? {NUMBER}", value)
    start = dt.date(2000, 1, 1).toordinal()
    for _i in range(6):
        day = dt.date.fromordinal(start + rng.randint(0, 12000))
        add("weekday", f"What day of the week was {day.isoformat()}? Reply with the weekday name only.",
            WEEKDAYS[day.weekday()], "exact")  # fmt: skip
    for _i in range(4):
        day = dt.date.fromordinal(start + rng.randint(0, 12000))
        n = rng.randint(10, 400)
        add("date", f"What date is {n} days after {day.isoformat()}? Reply with the date only, as YYYY-MM-DD.",
            (day + dt.timedelta(days=n)).isoformat(), "exact")  # fmt: skip
    for country, city, aliases in CAPITALS:
        add("capital", f"What is the capital of {country}? Reply with the city name only.", city, "exact",
            aliases=aliases)  # fmt: skip
    for value, src, dst, expected, tol in CONVERSIONS:
        add("convert", f"Convert {value} {src} to {dst}. {NUMBER}", expected, tolerance=tol)
    for _i in range(2):
        a, b, c = rng.randint(10, 40), rng.randint(1, 9), rng.randint(2, 20)
        add("reason", f"Alice has {a} apples. She gives {b} to Bob and then buys {c} more. "
            f"How many apples does Alice have now? {NUMBER}", a - b + c)  # fmt: skip
    for _i in range(2):
        v, h = rng.randint(40, 120), rng.choice([1.5, 2, 2.5, 3, 4])
        add("reason", f"A train travels at {v} km/h for {h:g} hours. How many kilometers does it travel? {NUMBER}",
            v * h if v * h != int(v * h) else int(v * h))  # fmt: skip
    d, a = rng.randint(2, 15), rng.randint(5, 40)
    add("reason", f"Tom is {d} years older than Ann. Ann is {a} years old. How old is Tom? {NUMBER}", a + d)
    n, m = rng.randint(6, 24), rng.randint(50, 300)
    add("reason", f"A box holds {n} pencils. How many boxes are needed for {m} pencils? {NUMBER}", math.ceil(m / n))
    return out


def document() -> str:
    data = {
        "schema": "gpufleet.quality_eval/v1",
        "name": "gpufleet-eval-v1",
        "description": "Rollout quality gate: short questions with exact answers (roles/rollout/files/quality_eval/"
        "generate.py; docs/quality-gate.md). Written by gpufleet, no third-party data.",
        "items": items(),
    }
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    text = document()
    if "--check" in sys.argv[1:]:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT}: {'up to date' if same else 'STALE: run roles/rollout/files/quality_eval/generate.py'}")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(items())} items)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
