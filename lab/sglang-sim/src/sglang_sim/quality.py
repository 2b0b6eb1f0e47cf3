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
* ``partial-quality-<group>=SHARE`` (``arithmetic``, ``facts``, ``multilingual``, ``tool-json``): the same, confined
  to the shapes of one item group (``GROUPS``), so a loss in one group is not averaged away by the others;
* ``non-english-corruption``: what operators report of FP4 kernels on sm_120 (docs/quality-gate.md): an answer with
  non-English letters gets one of them replaced by U+FFFD or by a look-alike of another script (Cyrillic for Latin,
  Latin for Cyrillic and Greek, a Latin letter after a Han one), and a tool call's JSON loses a quote; English and
  numbers stay right;
* ``nan-output`` is textgen's (token 0 at every step, before any answer is computed).

The answers are bare (``936``, ``Friday``, ``Tokyo``), as a model asked to "reply with the number only" gives
them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
import unicodedata

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
    "nigeria": ("Abuja", "Lagos"),
    "pakistan": ("Islamabad", "Karachi"),
    "kazakhstan": ("Astana", "Almaty"),
    "tanzania": ("Dodoma", "Dar es Salaam"),
    "myanmar": ("Naypyidaw", "Yangon"),
    "bolivia": ("Sucre", "La Paz"),
    "south africa": ("Pretoria", "Johannesburg"),
    "sri lanka": ("Sri Jayawardenepura Kotte", "Colombo"),
}

# Weekday and month names (Monday, January first) in the languages the evaluation set asks for
NAMES = {
    "german": (("Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag", "Sonntag"),
               ("Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
                "November", "Dezember")),
    "french": (("lundi", "mardi", "mercredi", "jeudi", "vendredi", "samedi", "dimanche"),
               ("janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre", "octobre",
                "novembre", "décembre")),
    "spanish": (("lunes", "martes", "miércoles", "jueves", "viernes", "sábado", "domingo"),
                ("enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "octubre",
                 "noviembre", "diciembre")),
    "russian": (("понедельник", "вторник", "среда", "четверг", "пятница", "суббота", "воскресенье"),
                ("январь", "февраль", "март", "апрель", "май", "июнь", "июль", "август", "сентябрь", "октябрь",
                 "ноябрь", "декабрь")),
    "greek": (("Δευτέρα", "Τρίτη", "Τετάρτη", "Πέμπτη", "Παρασκευή", "Σάββατο", "Κυριακή"),
              ("Ιανουάριος", "Φεβρουάριος", "Μάρτιος", "Απρίλιος", "Μάιος", "Ιούνιος", "Ιούλιος", "Αύγουστος",
               "Σεπτέμβριος", "Οκτώβριος", "Νοέμβριος", "Δεκέμβριος")),
    "japanese": (("月曜日", "火曜日", "水曜日", "木曜日", "金曜日", "土曜日", "日曜日"),
                 tuple(f"{m}月" for m in range(1, 13))),
    "chinese": (("星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日"),
                ("一月", "二月", "三月", "四月", "五月", "六月", "七月", "八月", "九月", "十月", "十一月", "十二月")),
}  # fmt: skip
# non-english-corruption: a letter and the look-alike of another script that replaces it
LOOKALIKE = {"a": "а", "e": "е", "o": "о", "c": "с", "p": "р", "а": "a", "е": "e", "о": "o", "с": "c", "р": "p",
             "α": "a", "ο": "o", "ε": "e", "ι": "i", "τ": "t"}  # fmt: skip

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
    # before "weekday": its pattern is a prefix of this one's
    ("weekday_lang", re.compile(rf"what day of the week (?:was|is) {_DATE}\? reply with the weekday name in (\w+)")),
    (
        "month_lang",
        re.compile(rf"in which month is the date (\d+) days after {_DATE}\? reply with the month name in (\w+)"),
    ),
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
# The item group of each shape (the evaluation set's groups; partial-quality-<group>)
GROUPS = {
    "arith": "arithmetic",
    "convert": "arithmetic",
    "apples": "arithmetic",
    "train": "arithmetic",
    "older": "arithmetic",
    "boxes": "arithmetic",
    "weekday": "facts",
    "days_after": "facts",
    "capital": "facts",
    "weekday_lang": "multilingual",
    "month_lang": "multilingual",
    "tool": "tool-json",
}
# "Call the tool `name` with a = <JSON>, b = <JSON>. Its parameters ..." (the prompt's own case: values are kept)
_TOOL = re.compile(r"Call the tool `(\w+)` with (.*?)\. Its parameters as JSON Schema", re.DOTALL)
_ARG = re.compile(r'(\w+) = ("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|true|false)')

_source: FaultSource | None = None


def current_faults() -> Faults:
    """The faults in force for this process: SGLANG_SIM_FAULT merged with SGLANG_SIM_FAULT_FILE (re-read when it
    changes), read quietly (the engine's own reader logs the changes)."""
    global _source
    if _source is None:
        _source = FaultSource(from_env(), quiet=True)
    return _source.current()


def share_for(shape: str, faults: Faults) -> float:
    """The partial-quality share for a shape: the fault over every group, or its group's, the larger."""
    group = GROUPS.get(shape, "").replace("-", "_")
    return max(faults.partial_quality, getattr(faults, f"partial_quality_{group}", 0.0) if group else 0.0)


def corrupt(text: str, prompt: str) -> str:
    """non-english-corruption of an answer: by the prompt's hash, either one non-ASCII letter replaced by U+FFFD, or
    a Han answer followed by a stray Latin letter, or a letter replaced by its look-alike of another script (Latin
    and Cyrillic, Greek to Latin); ASCII answers stay as they are."""
    letters = [i for i, c in enumerate(text) if c.isalpha() and not c.isascii()]
    if not letters:
        return text
    digest = int(hashlib.sha256(("corrupt:" + prompt).encode("utf-8", "replace")).hexdigest()[:8], 16)
    if digest % 2:
        if any("CJK" in unicodedata.name(c, "") for c in text):
            return text + "a"  # a stray Latin letter after Han ones
        swap = [i for i in range(len(text)) if text[i].lower() in LOOKALIKE]
        if swap:
            i = swap[digest % len(swap)]
            return text[:i] + LOOKALIKE[text[i].lower()] + text[i + 1 :]
    i = letters[digest % len(letters)]
    return text[:i] + "\ufffd" + text[i + 1 :]


def hash_fraction(prompt: str) -> float:
    """The first 8 hex digits of sha256 of the prompt, as a fraction of 2^32: where the prompt stands in every
    partial-quality share."""
    return int(hashlib.sha256(prompt.encode("utf-8", "replace")).hexdigest()[:8], 16) / 2**32


def degraded(prompt: str, share: float) -> bool:
    """Whether ``partial-quality=share`` makes this prompt's computed answer wrong (deterministic)."""
    return share > 0 and hash_fraction(prompt) < share


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
    if shape in ("weekday_lang", "month_lang"):
        names = NAMES.get(g[-1])
        if names is None:
            return None
        if shape == "weekday_lang":
            return names[0][(dt.date.fromisoformat(g[0]).weekday() + (1 if wrong else 0)) % 7]
        date = dt.date.fromisoformat(g[1]) + dt.timedelta(days=int(g[0]))
        return names[1][(date.month - 1 + (1 if wrong else 0)) % 12]
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
    faults = current_faults()
    tool = _TOOL.search(prompt)
    if tool:
        return _tool_call(tool, wrong or degraded(prompt, share_for("tool", faults)), faults.non_english_corruption)
    text = " ".join(prompt.lower().split())
    for shape, rx in _SHAPES:
        m = rx.search(text)
        if m:
            bad = wrong or degraded(prompt, share_for(shape, faults))
            try:
                computed = _compute(shape, m, bad)
            except (ValueError, OverflowError):
                return None
            if computed is not None and faults.non_english_corruption:
                computed = corrupt(computed, prompt)
            return computed
    return None


def _tool_call(m: re.Match, wrong: bool, corrupted: bool) -> str:
    """The tool call a model gives for "Call the tool `name` with a = 1, b = "x"": one JSON object; ``wrong``
    changes one argument (a number off by one, a string's first letter dropped, a boolean flipped); ``corrupted``
    (non-english-corruption) drops the quote after the first key: the JSON no longer parses."""
    args = {}
    for key, raw in _ARG.findall(m.group(2)):
        args[key] = json.loads(raw)
    if wrong and args:
        key = sorted(args)[0]
        value = args[key]
        if isinstance(value, bool):
            args[key] = not value
        elif isinstance(value, (int, float)):
            args[key] = value + 1
        else:
            args[key] = value[1:] or "x"
    text = json.dumps({"name": m.group(1), "arguments": args}, ensure_ascii=False)
    if corrupted:
        text = text.replace('"name"', '"name', 1)
    return text
