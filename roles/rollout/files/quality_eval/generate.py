"""Write the quality gate's evaluation set, gpufleet-eval-v2.json, next to this file (docs/quality-gate.md).

Written by us, no third-party data. Four item groups of 100 items each, every group scored by its own test so a
regression confined to one is not averaged away (the failure modes engine upgrades bring: wrong arithmetic, FP4
kernels that corrupt non-English text and tool-call JSON while English prose looks fine):

* ``arithmetic`` (matcher ``numeric``): sums, differences, products, unit conversions, short word problems;
* ``facts`` (``exact``, English): the weekday of a date, date arithmetic, capitals;
* ``multilingual`` (``exact``, with a ``script``): a weekday or month name in German, French, Spanish, Russian,
  Greek, Japanese or Chinese; an answer with a replacement character (U+FFFD) or letters of another script fails
  and says so;
* ``tool_json`` (``json``): a tool call as one JSON object whose arguments must validate against the tool's JSON
  Schema and equal the requested ones (some in other languages).

And eight fixed prompts (``logprob_prompts``) whose greedy tokens' log-probabilities a baseline records and the gate
compares.

Deterministic (a fixed seed): running it again writes the same bytes (tests/unit/rollout/test_quality_eval.py checks
the file against it).

    python roles/rollout/files/quality_eval/generate.py [--check]
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import sys
from pathlib import Path

NAME = "gpufleet-eval-v2"
OUT = Path(__file__).resolve().parent / f"{NAME}.json"
SEED = 20261207
PER_GROUP = 100
NUMBER = "Reply with the number only."
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")  # fmt: skip
CAPITALS = (
    ("Japan", "Tokyo", []),
    ("Canada", "Ottawa", []),
    ("Australia", "Canberra", []),
    ("Brazil", "Brasília", ["Brasilia"]),
    ("Kenya", "Nairobi", []),
    ("Norway", "Oslo", []),
    ("Turkey", "Ankara", []),
    ("New Zealand", "Wellington", []),
    ("Egypt", "Cairo", []),
    ("Vietnam", "Hanoi", []),
    ("Switzerland", "Bern", ["Berne"]),
    ("Morocco", "Rabat", []),
    ("Nigeria", "Abuja", []),
    ("Pakistan", "Islamabad", []),
    ("Kazakhstan", "Astana", []),
    ("Tanzania", "Dodoma", []),
    ("Myanmar", "Naypyidaw", ["Nay Pyi Taw", "Naypyitaw"]),
    ("Bolivia", "Sucre", []),
    ("South Africa", "Pretoria", []),
    ("Sri Lanka", "Sri Jayawardenepura Kotte", ["Kotte"]),
)
# (km/h style) conversions: source unit, target unit, factor or offset rule, tolerance
CONVERSIONS = (
    ("kilometers", "meters", lambda v: v * 1000, 0),
    ("miles", "kilometers", lambda v: v * 1.609344, 0.01),
    ("kilograms", "grams", lambda v: v * 1000, 0),
    ("hours", "minutes", lambda v: v * 60, 0),
    ("degrees Fahrenheit", "degrees Celsius", lambda v: (v - 32) * 5 / 9, 0.01),
    ("gibibytes", "mebibytes", lambda v: v * 1024, 0),
    ("liters", "milliliters", lambda v: v * 1000, 0),
)
# Weekday and month names, Monday and January first; the script the answer must be written in.
LANGUAGES = {
    "German": ("latin", ("Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag", "Sonntag"),
               ("Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
                "November", "Dezember")),
    "French": ("latin", ("lundi", "mardi", "mercredi", "jeudi", "vendredi", "samedi", "dimanche"),
               ("janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre", "octobre",
                "novembre", "décembre")),
    "Spanish": ("latin", ("lunes", "martes", "miércoles", "jueves", "viernes", "sábado", "domingo"),
                ("enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "octubre",
                 "noviembre", "diciembre")),
    "Russian": ("cyrillic", ("понедельник", "вторник", "среда", "четверг", "пятница", "суббота", "воскресенье"),
                ("январь", "февраль", "март", "апрель", "май", "июнь", "июль", "август", "сентябрь", "октябрь",
                 "ноябрь", "декабрь")),
    "Greek": ("greek", ("Δευτέρα", "Τρίτη", "Τετάρτη", "Πέμπτη", "Παρασκευή", "Σάββατο", "Κυριακή"),
              ("Ιανουάριος", "Φεβρουάριος", "Μάρτιος", "Απρίλιος", "Μάιος", "Ιούνιος", "Ιούλιος", "Αύγουστος",
               "Σεπτέμβριος", "Οκτώβριος", "Νοέμβριος", "Δεκέμβριος")),
    "Japanese": ("han", ("月曜日", "火曜日", "水曜日", "木曜日", "金曜日", "土曜日", "日曜日"),
                 tuple(f"{m}月" for m in range(1, 13))),
    "Chinese": ("han", ("星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日"),
                ("一月", "二月", "三月", "四月", "五月", "六月", "七月", "八月", "九月", "十月", "十一月", "十二月")),
}  # fmt: skip
ALIASES = {"Samstag": ["Sonnabend"], "星期日": ["星期天"]}
# Tools: name -> JSON Schema of the arguments (the subset the matcher validates: object, properties, required,
# additionalProperties, type string/integer/number/boolean, enum, pattern-free)
TOOLS = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "convert_currency": {
        "type": "object",
        "properties": {
            "amount": {"type": "number"},
            "from": {"type": "string", "enum": ["EUR", "USD", "JPY", "GBP", "CHF"]},
            "to": {"type": "string", "enum": ["EUR", "USD", "JPY", "GBP", "CHF"]},
        },
        "required": ["amount", "from", "to"],
        "additionalProperties": False,
    },
    "create_event": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "date": {"type": "string"}, "attendees": {"type": "integer"}},
        "required": ["title", "date", "attendees"],
        "additionalProperties": False,
    },
    "set_timer": {
        "type": "object",
        "properties": {"minutes": {"type": "integer"}, "label": {"type": "string"}, "repeat": {"type": "boolean"}},
        "required": ["minutes", "label", "repeat"],
        "additionalProperties": False,
    },
}
CITIES = ("Oslo", "Zürich", "São Paulo", "Kraków", "Москва", "東京", "Αθήνα", "Reykjavík", "Nairobi", "Lima")
TITLES = ("Team meeting", "Réunion d'équipe", "Sprint-Planung", "Revisión del presupuesto", "Планёрка", "定例会議",
          "Συνάντηση ομάδας", "Quarterly review")  # fmt: skip
LABELS = ("tea", "pasta", "Kaffee", "thé", "чай", "お茶", "stretch", "laundry")


def _number(value: float):
    return int(round(value)) if math.isclose(value, round(value), abs_tol=1e-9) else round(value, 4)


class Items:
    def __init__(self):
        self.rng = random.Random(SEED)
        self.items: list[dict] = []
        self.prompts: set[str] = set()
        self.counts: dict[str, int] = {}

    def add(self, group: str, kind: str, prompt: str, expected, match: str = "numeric", **extra) -> bool:
        if prompt in self.prompts:
            return False
        self.prompts.add(prompt)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        iid = f"{kind}-{self.counts[kind]:03d}"
        self.items.append({"id": iid, "group": group, "prompt": prompt, "expected": expected, "match": match, **extra})
        return True

    def date(self) -> dt.date:
        return dt.date.fromordinal(dt.date(2000, 1, 1).toordinal() + self.rng.randint(0, 12000))

    def fill(self, group: str, count: int, make) -> None:
        start = len([i for i in self.items if i["group"] == group])
        while len([i for i in self.items if i["group"] == group]) < start + count:
            make()


def arithmetic(s: Items) -> None:
    rng = s.rng

    def arith():
        op = rng.choice("+-*")
        a, b = rng.randint(12, 999), rng.randint(12, 999)
        if op == "-" and b > a:
            a, b = b, a
        if op == "*":
            b = rng.randint(3, 99)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        s.add("arithmetic", "arith", f"What is {a} {op} {b}? {NUMBER}", value)

    def convert():
        src, dst, rule, tol = rng.choice(CONVERSIONS)
        value = rng.choice([rng.randint(2, 250), rng.randint(10, 900) / 10])
        extra = {"tolerance": tol} if tol else {}
        s.add("arithmetic", "convert", f"Convert {value:g} {src} to {dst}. {NUMBER}", _number(rule(value)), **extra)

    def reason():
        kind = rng.randrange(4)
        if kind == 0:
            a, b, c = rng.randint(10, 40), rng.randint(1, 9), rng.randint(2, 20)
            s.add("arithmetic", "reason", f"Alice has {a} apples. She gives {b} to Bob and then buys {c} more. "
                  f"How many apples does Alice have now? {NUMBER}", a - b + c)  # fmt: skip
        elif kind == 1:
            v, h = rng.randint(40, 120), rng.choice([1.5, 2, 2.5, 3, 4])
            s.add("arithmetic", "reason", f"A train travels at {v} km/h for {h:g} hours. How many kilometers does it "
                  f"travel? {NUMBER}", _number(v * h))  # fmt: skip
        elif kind == 2:
            d, a = rng.randint(2, 15), rng.randint(5, 40)
            s.add("arithmetic", "reason", f"Tom is {d} years older than Ann. Ann is {a} years old. How old is Tom? "
                  f"{NUMBER}", a + d)  # fmt: skip
        else:
            n, m = rng.randint(6, 24), rng.randint(50, 300)
            s.add("arithmetic", "reason", f"A box holds {n} pencils. How many boxes are needed for {m} pencils? "
                  f"{NUMBER}", math.ceil(m / n))  # fmt: skip

    s.fill("arithmetic", 60, arith)
    s.fill("arithmetic", 20, convert)
    s.fill("arithmetic", 20, reason)


def facts(s: Items) -> None:
    def weekday():
        day = s.date()
        s.add("facts", "weekday", f"What day of the week was {day.isoformat()}? Reply with the weekday name only.",
              WEEKDAYS[day.weekday()], "exact")  # fmt: skip

    def days_after():
        day, n = s.date(), s.rng.randint(10, 400)
        s.add("facts", "date", f"What date is {n} days after {day.isoformat()}? Reply with the date only, as "
              "YYYY-MM-DD.", (day + dt.timedelta(days=n)).isoformat(), "exact")  # fmt: skip

    s.fill("facts", 40, weekday)
    s.fill("facts", 40, days_after)
    for country, city, aliases in CAPITALS:
        s.add("facts", "capital", f"What is the capital of {country}? Reply with the city name only.", city, "exact",
              aliases=aliases)  # fmt: skip


def multilingual(s: Items) -> None:
    languages = sorted(LANGUAGES)

    def weekday():
        lang, day = s.rng.choice(languages), s.date()
        script, names, _months = LANGUAGES[lang]
        name = names[day.weekday()]
        s.add("multilingual", "weekday-lang", f"What day of the week was {day.isoformat()}? Reply with the weekday "
              f"name in {lang} only.", name, "exact", script=script, aliases=ALIASES.get(name, []))  # fmt: skip

    def month():
        lang, day, n = s.rng.choice(languages), s.date(), s.rng.randint(10, 300)
        script, _names, months = LANGUAGES[lang]
        s.add("multilingual", "month-lang", f"In which month is the date {n} days after {day.isoformat()}? Reply "
              f"with the month name in {lang} only.", months[(day + dt.timedelta(days=n)).month - 1], "exact",
              script=script)  # fmt: skip

    s.fill("multilingual", 60, weekday)
    s.fill("multilingual", 40, month)


def tool_json(s: Items) -> None:
    rng = s.rng

    def call():
        name = rng.choice(sorted(TOOLS))
        if name == "get_weather":
            args = {"city": rng.choice(CITIES), "unit": rng.choice(["celsius", "fahrenheit"])}
        elif name == "convert_currency":
            a, b = rng.sample(["EUR", "USD", "JPY", "GBP", "CHF"], 2)
            args = {"amount": rng.choice([rng.randint(5, 5000), rng.randint(100, 99999) / 100]), "from": a, "to": b}
        elif name == "create_event":
            args = {"title": rng.choice(TITLES), "date": s.date().isoformat(), "attendees": rng.randint(2, 40)}
        else:
            args = {"minutes": rng.randint(1, 180), "label": rng.choice(LABELS), "repeat": rng.random() < 0.3}
        given = ", ".join(f"{k} = {json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
        schema = json.dumps(TOOLS[name], ensure_ascii=False, separators=(", ", ": "))
        prompt = (f"Call the tool `{name}` with {given}. Its parameters as JSON Schema: {schema}. Reply with only "
                  'the call as one JSON object, {"name": ..., "arguments": {...}}, and no other text.')  # fmt: skip
        s.add("tool_json", "tool", prompt, {"name": name, "arguments": args}, "json", schema=TOOLS[name],
              max_tokens=96)  # fmt: skip

    s.fill("tool_json", PER_GROUP, call)


# Fixed prompts whose greedy tokens' top-k log-probabilities a baseline run records and the gate compares
# (docs/quality-gate.md, "The logprob comparison"): prose in English and in other scripts, code, a tool call, numbers.
LOGPROB_PROMPTS = (
    ("prose-en", "Explain in two sentences why a rolling deploy drains a server before restarting it."),
    ("prose-de", "Erkläre in zwei Sätzen, warum ein Server vor dem Neustart aus dem Lastverteiler genommen wird."),
    ("prose-ja", "サーバーを再起動する前に負荷分散から外す理由を二文で説明してください。"),
    ("prose-ru", "Объясни в двух предложениях, зачем перед перезапуском сервер выводят из балансировщика."),
    ("code-py", "Write a Python function is_prime(n) that returns True when n is a prime number."),
    ("tool-call", 'Call the tool `get_weather` with city = "Zürich", unit = "celsius". Reply with only the JSON.'),
    ("numbers", "List the first ten square numbers, separated by commas."),
    ("facts-en", "Name three rivers of Europe and the seas they flow into."),
)


def logprob_prompts() -> list[dict]:
    return [{"id": pid, "prompt": prompt, "max_tokens": 32} for pid, prompt in LOGPROB_PROMPTS]


def items() -> list[dict]:
    s = Items()
    for make in (arithmetic, facts, multilingual, tool_json):
        make(s)
    return s.items


def document() -> str:
    data = {
        "schema": "gpufleet.quality_eval/v1",
        "name": NAME,
        "description": "Quality gate: short questions with exact answers in four groups (arithmetic, facts, "
        "multilingual, tool_json), drawn at random by the gate's sequential test (roles/rollout/files/quality_eval/"
        "generate.py; docs/quality-gate.md). Written by gpufleet, no third-party data.",
        "items": items(),
        "logprob_prompts": logprob_prompts(),
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
