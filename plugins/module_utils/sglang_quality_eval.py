"""The quality gate of a rollout's canary (module sglang_quality_eval; docs/quality-gate.md): an evaluation set of
items with exact answers in groups (roles/rollout/files/quality_eval/), asked at temperature 0 through the server's
OpenAI API, each answer matched (``exact``, with the item's ``script`` checked; ``numeric``; ``json``, a tool call
validated against its schema); the journal of the running start searched for SGLang's NaN line; and the verdict
against a stored baseline of the same GPU class, model and lane by a sequential test on regressions
(module_utils/quality_sprt.py): items the baseline answered right, drawn at random per group, asked until the test
decides. A baseline run asks every item. Standard library only; unit-tested with fakes and against the lab's
simulated engine.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import shlex
import time
import unicodedata
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from ansible_collections.gpufleet.fleet.plugins.module_utils.quality_sprt import (
    GateRun,
    GateSettings,
    available_by_group,
    draw_order,
    group_of,
    too_few,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_command import run
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_http import http, server_api
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_journal import journal_lines
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_smoke import split_message
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import unit_state

EVAL_SCHEMA = "gpufleet.quality_eval/v1"
BASELINE_SCHEMA = "gpufleet.quality_baseline/v1"
MATCHERS = ("exact", "numeric", "json")
# The script an ``exact`` item's answer must be written in: the Unicode character-name prefixes of its letters
# (Japanese and Chinese answers are Han; kana counts with them)
SCRIPTS = {
    "latin": ("LATIN",),
    "cyrillic": ("CYRILLIC",),
    "greek": ("GREEK",),
    "han": ("CJK", "HIRAGANA", "KATAKANA"),
}
JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}
# SGLang's lines for NaN logits, per engine version (a pattern per line; docs/quality-gate.md, "NaN detection"):
# - 0.5.9 and 0.5.10.post1 layers/sampler.py:67 (0.5.10.post1: 68), with --enable-nan-detection only, a WARNING per
#   decode step: "Detected errors during sampling! NaN in the logits." (the NaN logits become -1e5, serving goes on);
# - 0.5.23 utils/async_probe.py:40-46, with SGLANG_SANITIZE_NAN_LOGITS=1, one WARNING per process: "NaN detected in
#   sampler: next_token_logits; values were sanitized before sampling. ..." (the logits sanitized, serving goes on);
# - 0.5.23 utils/async_probe.py:118-159, with SGLANG_ENABLE_NAN_LOGITS_CHECK=1, a device-side assert "NaN detected!
#   sampler: next_token_logits" that ends the server through the scheduler's exception (scheduler.py:6370-6373).
NAN_PATTERNS = (r"NaN in the logits", r"NaN detected in \S.*values were sanitized", r"NaN detected! ")
# The environment variables that turn 0.5.23's NaN checks on (environ.py:516 and 1511, EnvBool: true/1/yes/y);
# --enable-nan-detection is gone there (0.5.10.post1 deprecated it for SGLANG_SPEC_NAN_DETECTION, which 0.5.23 no
# longer has either).
NAN_ENV = ("SGLANG_SANITIZE_NAN_LOGITS", "SGLANG_ENABLE_NAN_LOGITS_CHECK")
ENV_TRUE = ("true", "1", "yes", "y")  # SGLang's EnvBool (0.5.23 environ.py:119-126)
FLAG_TRUE = ("true", "1", "yes", "on")  # a flag's value in the inventory (YAML and strings)


def nan_check_on(flags, environment) -> bool:
    """Whether the server logs NaN logits: the flag enable-nan-detection (0.5.9, 0.5.10.post1) or one of ``NAN_ENV``
    in its environment (0.5.23), each as SGLang reads it."""
    flags = flags if isinstance(flags, dict) else {}
    environment = environment if isinstance(environment, dict) else {}
    flag = str(flags.get("enable-nan-detection", False)).strip().lower() in FLAG_TRUE
    return flag or any(str(environment.get(name, "")).strip().lower() in ENV_TRUE for name in NAN_ENV)


# The module's options and their defaults (plugins/modules/sglang_quality_eval.py documents them).
EVAL_OPTIONS = {
    "base_url": {"type": "str", "required": True},
    "served_name": {"type": "str", "required": True},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "secrets_file": {"type": "path", "default": ""},
    "eval_set": {"type": "dict", "required": True},
    # no_log False: token counts and the comparison key, not secrets ("token", "key" in a name look like one)
    "max_tokens": {"type": "int", "default": 32, "no_log": False},
    "thinking": {"type": "bool", "default": False},
    "reasoning_parser": {"type": "str", "default": ""},
    "reasoning_max_tokens": {"type": "int", "default": 1024, "no_log": False},
    "concurrency": {"type": "int", "default": 8},
    "timeout": {"type": "float", "default": 120.0},
    "unit": {"type": "str", "default": ""},
    "nan_patterns": {"type": "list", "elements": "str", "default": list(NAN_PATTERNS)},
    "baseline": {"type": "dict", "default": {}},
    # the sequential test (module_utils/quality_sprt.py GateSettings)
    "noise": {"type": "float", "default": 0.01},
    "allowed_drop": {"type": "float", "default": 0.05},
    "group_drop": {"type": "float", "default": 0.25},
    "false_rollback": {"type": "float", "default": 0.02},
    "miss": {"type": "float", "default": 0.04},
    "max_items": {"type": "int", "default": 240},
    "seed": {"type": "str", "default": ""},
    # the logprob comparison (0 = off)
    "logprob_top_k": {"type": "int", "default": 5},
    "logprob_max_divergence": {"type": "float", "default": 0.02},
    "worst": {"type": "int", "default": 5},
    "key": {"type": "dict", "default": {}, "no_log": False},
    "host": {"type": "str", "default": ""},
}

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_PREFIX = re.compile(r"^(?:final answer|answer|the answer is|result)\s*[:=\-]?\s*", re.IGNORECASE)


# ---------------------------------------------------------------- the evaluation set


def check_eval_set(data) -> list[str]:
    """One line per problem of an evaluation set (schema, items with unique ids, a prompt, an expected answer, a
    known matcher, a numeric expectation that is a number, a tolerance >= 0); [] when it can be used."""
    if not isinstance(data, dict):
        return [f"the evaluation set is not a mapping (got {type(data).__name__})"]
    problems = []
    if data.get("schema") != EVAL_SCHEMA:
        problems.append(f"schema is {data.get('schema')!r}, expected {EVAL_SCHEMA!r}")
    if not str(data.get("name") or "").strip():
        problems.append("the evaluation set has no name")
    items = data.get("items")
    if not isinstance(items, list) or not items:
        return problems + ["the evaluation set has no items"]
    seen = set()
    for n, item in enumerate(items):
        where = f"item {n}"
        if not isinstance(item, dict):
            problems.append(f"{where} is not a mapping")
            continue
        iid = str(item.get("id") or "")
        where = f"item {iid or n}"
        if not iid:
            problems.append(f"item {n} has no id")
        elif iid in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(iid)
        if not str(item.get("prompt") or "").strip():
            problems.append(f"{where} has no prompt")
        matcher = item.get("match", "exact")
        if matcher not in MATCHERS:
            problems.append(f"{where}: unknown matcher {matcher!r} (known: {', '.join(MATCHERS)})")
        expected = item.get("expected")
        if expected is None or str(expected).strip() == "":
            problems.append(f"{where} has no expected answer")
        elif matcher == "json":
            if (
                not isinstance(expected, dict)
                or not str(expected.get("name") or "")
                or not isinstance(expected.get("arguments"), dict)
            ):
                problems.append(f"{where}: a json item's expected answer is {{name, arguments}} (got {expected!r})")
            if not isinstance(item.get("schema", {}), dict):
                problems.append(f"{where}: schema must be a JSON Schema object")
        elif matcher == "numeric":
            try:
                float(expected)
            except (TypeError, ValueError):
                problems.append(f"{where}: numeric expected answer {expected!r} is not a number")
        if item.get("script") is not None and item.get("script") not in SCRIPTS:
            problems.append(f"{where}: unknown script {item.get('script')!r} (known: {', '.join(SCRIPTS)})")
        if not isinstance(item.get("group", ""), str):
            problems.append(f"{where}: group must be a string")
        tol = item.get("tolerance", 0)
        if not isinstance(tol, (int, float)) or isinstance(tol, bool) or tol < 0:
            problems.append(f"{where}: tolerance must be a number >= 0 (got {tol!r})")
    prompts = data.get("logprob_prompts", [])
    if not isinstance(prompts, list) or not all(
        isinstance(x, dict) and str(x.get("id") or "") and str(x.get("prompt") or "").strip() for x in prompts
    ):
        problems.append("logprob_prompts must be a list of {id, prompt, max_tokens}")
    return problems


def eval_set_digest(data: dict) -> str:
    """sha256 of the items (and the logprob prompts, where there are any) as canonical JSON: a baseline is only
    comparable with a run of the same items."""
    content = data.get("items", [])
    if data.get("logprob_prompts"):
        content = {"items": content, "logprob_prompts": data["logprob_prompts"]}
    canon = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode()).hexdigest()


# ---------------------------------------------------------------- normalising and matching


def normalise(text) -> str:
    """An answer as the ``exact`` matcher compares it: the answer's first non-empty line, markdown emphasis,
    quotes and an "Answer:" prefix removed, whitespace collapsed, a trailing full stop removed, lower case."""
    lines = [x.strip() for x in str(text or "").strip().splitlines() if x.strip()]
    s = lines[0] if lines else ""
    s = s.replace("**", "").replace("__", "").replace("`", "")
    s = _PREFIX.sub("", s).strip()
    s = s.strip("\"'\u201c\u201d\u2018\u2019 ")  # ASCII and typographic quotes
    s = re.sub(r"\s+", " ", s)
    s = s.rstrip(".!").strip()
    return s.lower()


def extract_number(text):
    """The last number in the answer (thousands separators allowed), as a float; None when there is none."""
    found = _NUMBER.findall(str(text or ""))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def script_problem(answer, script: str) -> str:
    """Why an answer is not text of ``script`` (SCRIPTS): a replacement character (U+FFFD, bytes that were not
    UTF-8), or letters of another script (a script mix-up); "" when it is."""
    text = str(answer or "")
    if "\ufffd" in text:
        return "a replacement character (U+FFFD) in the answer"
    prefixes = SCRIPTS.get(script)
    if not prefixes:
        return ""
    foreign = sorted(
        {unicodedata.name(c, "?").split(" ")[0].title() for c in text if c.isalpha()} - {p.title() for p in prefixes}
    )
    if foreign:
        return f"a script mix-up: {', '.join(foreign)} letters in an answer expected in {script.title()}"
    return ""


def _json_object(answer):
    """The JSON object in an answer (a markdown code fence allowed), or raise ValueError."""
    text = str(answer or "").strip()
    if text.startswith("```"):
        text = text.strip("`")
        text = text[4:] if text.lower().startswith("json") else text
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the answer")
    return json.loads(text[start : end + 1])


def schema_problems(value, schema: dict, where: str = "arguments") -> list[str]:
    """Where ``value`` breaks ``schema`` (the subset the evaluation set uses: type, properties, required,
    additionalProperties false, enum)."""
    out = []
    want = schema.get("type")
    types = JSON_TYPES.get(want)
    if types is not None:
        wrong = not isinstance(value, types) or (want in ("integer", "number") and isinstance(value, bool))
        if want == "integer" and isinstance(value, float) and value.is_integer():
            wrong = False
        if wrong:
            return [f"{where}: {value!r} is not of type {want}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{where}.{k}: missing" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            out += [f"{where}.{k}: not a parameter of the tool" for k in value if k not in props]
        for k, sub in props.items():
            if k in value:
                out += schema_problems(value[k], sub, f"{where}.{k}")
    return out


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, str) and isinstance(b, str):
        return unicodedata.normalize("NFC", a) == unicodedata.normalize("NFC", b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def check_answer(item: dict, answer) -> tuple[bool, str]:
    """``(ok, why)``: whether ``answer`` is the item's expected answer by its matcher, and why not (or ""):

    * ``exact``: normalised text equal to the expected answer or one of its ``aliases``; with a ``script``, an
      answer with a replacement character or letters of another script says so;
    * ``numeric``: the answer's last number within ``tolerance`` of the expected number (0 = equal up to float
      rounding);
    * ``json``: a tool call, one JSON object ``{name, arguments}`` (a code fence allowed) whose arguments validate
      against the item's ``schema`` and equal the expected ones."""
    matcher = item.get("match", "exact")
    if matcher == "numeric":
        got = extract_number(answer)
        if got is None:
            return False, "no number in the answer"
        want = float(item["expected"])
        tol = float(item.get("tolerance", 0) or 0)
        ok = math.isclose(got, want, rel_tol=1e-9, abs_tol=max(tol, 1e-9))
        return ok, "" if ok else f"{got:g} is not {want:g}"
    if matcher == "json":
        try:
            call = _json_object(answer)
        except ValueError as e:
            return False, f"not a JSON object ({str(e)[:80]})"
        if not isinstance(call, dict):
            return False, "the call is not a JSON object"
        expected = item["expected"]
        if call.get("name") != expected.get("name"):
            return False, f"called {call.get('name')!r}, not {expected.get('name')!r}"
        problems = schema_problems(call.get("arguments"), item.get("schema") or {"type": "object"})
        if problems:
            return False, "the arguments break the tool's schema: " + "; ".join(problems[:3])
        if not _same(call.get("arguments"), expected.get("arguments")):
            return False, "the arguments differ from the requested ones"
        return True, ""
    wanted = {normalise(item["expected"])} | {normalise(a) for a in item.get("aliases", [])}
    if normalise(answer) in wanted:
        return True, ""
    return False, script_problem(answer, item["script"]) if item.get("script") else ""


def matches(item: dict, answer) -> bool:
    """Whether ``answer`` is the item's expected answer by its matcher (``check_answer``)."""
    return check_answer(item, answer)[0]


# ---------------------------------------------------------------- score, worst items, verdict


def score(results: list[dict]) -> dict:
    """``{correct, total, score}``: the share of exact answers (0.0 for no item)."""
    total = len(results)
    correct = sum(1 for r in results if r.get("ok"))
    return {"correct": correct, "total": total, "score": round(correct / total, 4) if total else 0.0}


def worst_items(results: list[dict], baseline: dict | None = None, limit: int = 5) -> list[dict]:
    """The failed items a person should look at first: those the baseline answered right (a regression), then the
    others, each as ``{id, group, prompt, expected, got, why}`` (``got`` cut at 120 characters)."""
    passed_before = {r.get("id") for r in (baseline or {}).get("items", []) if r.get("ok")}
    failed = [r for r in results if not r.get("ok")]
    failed.sort(key=lambda r: (r.get("id") not in passed_before, str(r.get("id"))))
    return [
        {
            "id": r.get("id"),
            "group": r.get("group", ""),
            "prompt": r.get("prompt"),
            "expected": r.get("expected"),
            "got": str(r.get("got") or r.get("error") or "")[:120],
            "why": r.get("why", ""),
        }
        for r in failed[: max(0, int(limit))]
    ]


def describe_worst(worst: list[dict]) -> str:
    return "; ".join(
        f"[{w['id']}] {w['prompt'][:100]!r}: expected {w['expected']!r}, got {w['got']!r}"
        + (f" ({w['why']})" if w.get("why") else "")
        for w in worst
    )


def settings_of(p: dict) -> GateSettings:
    """The sequential test's settings from the module's options."""
    return GateSettings(
        noise=float(p["noise"]),
        drop=float(p["allowed_drop"]),
        group_drop=float(p["group_drop"]),
        alpha=float(p["false_rollback"]),
        beta=float(p["miss"]),
        max_items=int(p["max_items"]),
    )


def error_rates(settings: GateSettings, group_tests: list) -> dict:
    """The error rates of the gate with these settings, computed exactly for each test (quality_sprt.Sprt.operating):
    a healthy canary (regression rate ``noise``) rolled back at most the sum over the tests (``false_rollback``), a
    uniform drop of ``drop`` caught by the overall test alone with probability ``detection``, a drop of
    ``group_drop`` confined to one group caught by that group's test with probability ``group_detection`` (the
    least over ``group_tests``, each a quality_sprt.Sprt)."""
    overall = settings.overall()
    healthy = overall.operating(settings.noise)
    return {
        "false_rollback": round(healthy["fail"] + sum(t.operating(settings.noise)["fail"] for t in group_tests), 4),
        "detection": round(overall.operating(overall.p1)["fail"], 4),
        "group_detection": round(min((t.operating(t.p1)["fail"] for t in group_tests), default=0.0), 4),
        "expected_items_healthy": round(healthy["expected_items"], 1),
    }


def _counts(summary: dict) -> str:
    return ", ".join(f"{g} {v['regressions']}/{v['items']}" for g, v in summary.items() if g != "all")


def judge(
    measured: dict, baseline: dict, gate: GateRun | None = None, worst_limit: int = 5, logprob: dict | None = None
) -> dict:
    """The verdict of a run against its baseline: ``ok`` when the sequential test passed (``gate``, fed the answers
    in draw order), the journal has no NaN line and the logprob comparison (``logprob``, compare_logprobs) passed or
    was not judged; ``reason`` names the test that decided, the regressions per group, the error rates the settings
    give, the logprob comparison and the worst items. ``baseline`` empty: ``ok`` None (measured only: a baseline
    run)."""
    results = measured.get("items", [])
    got = score(results)
    worst = worst_items(results, baseline, worst_limit)
    verdict = {
        "score": got["score"],
        "correct": got["correct"],
        "total": got["total"],
        "worst": worst,
        "nan_detection": measured.get("nan_detection"),
        "nan_lines": measured.get("nan_lines", []),
        "decision": {},
        "failed_group": None,
        "rates": {},
        "logprob": logprob or {},
    }
    nan = measured.get("nan_lines") or []
    if not baseline or gate is None:
        verdict.update(ok=None, baseline_score=None, reason=f"score {got['score']:.3f} measured ({got['total']} items)")
        return verdict
    decided = gate.verdict or gate.finish()
    summary = gate.summary()
    settings = gate.settings
    rates = error_rates(settings, [t for g, t in gate.tests.items() if g != "all"])
    base = float(baseline.get("score", 0))
    whole = summary["all"]
    if decided == "fail":
        by = gate.failed_by
        test = summary[by]
        what = (
            f"a {settings.drop * 100:g}-point drop over all groups"
            if by == "all"
            else f"a {settings.group_drop * 100:g}-point drop in group {by}"
        )
        head = (
            f"the sequential test for {what} failed it: {test['regressions_then']} regressions in "
            f"{test['decided_after']} items the baseline answered right"
        )
    else:
        head = (
            f"passed the sequential test after {whole['items']} items: {whole['regressions']} regressions in items "
            "the baseline answered right"
        )
    parts = [
        f"{head} (by group: {_counts(summary)}); baseline {base:.3f} ({baseline.get('correct', '?')}/"
        f"{baseline.get('total', '?')}, {baseline.get('written_at', 'undated')}, host {baseline.get('host', '?')}); "
        f"the test: a healthy canary rolled back at most {rates['false_rollback'] * 100:.1f}% of the time, a "
        f"{settings.drop * 100:g}-point drop caught {rates['detection'] * 100:.1f}%, a {settings.group_drop * 100:g}-"
        f"point drop in one group {rates['group_detection'] * 100:.1f}%"
    ]
    if nan:
        parts.append(f"{len(nan)} NaN line(s) in the engine's journal since its start, first: {nan[0]}")
    logprob_failed = bool(logprob) and not logprob.get("skipped") and not logprob.get("advisory") and not logprob["ok"]
    if logprob:
        parts.append(describe_logprobs(logprob))
    if worst:
        parts.append("worst items: " + describe_worst(worst))
    verdict.update(
        ok=decided == "pass" and not nan and not logprob_failed,
        baseline_score=base,
        reason="; ".join(parts),
        decision=summary,
        failed_group=gate.failed_by,
        rates=rates,
    )
    return verdict


def baseline_problems(baseline, key: dict, digest: str, path: str) -> list[str]:
    """Why a stored baseline cannot judge this run: missing, of another schema, key or evaluation set."""
    if not baseline:
        return [f"no quality baseline at {path}"]
    if not isinstance(baseline, dict) or baseline.get("schema") != BASELINE_SCHEMA:
        return [f"{path} is not a quality baseline (schema {BASELINE_SCHEMA})"]
    problems = []
    for field in ("gpu_class", "model", "lane"):
        if str(baseline.get(field)) != str(key.get(field)):
            problems.append(f"{path} is the baseline of {field} {baseline.get(field)!r}, not {key.get(field)!r}")
    if baseline.get("eval_set_sha256") != digest:
        problems.append(
            f"{path} was measured with another evaluation set ({baseline.get('eval_set', '?')} "
            f"sha256 {str(baseline.get('eval_set_sha256'))[:12]}, now {digest[:12]}): write it again"
        )
    return problems


# ---------------------------------------------------------------- the logprob comparison


def ask_logprobs(post, prompt: dict, served_name: str, top_k: int) -> dict:
    """One fixed prompt at temperature 0 with ``logprobs``: ``{id, tokens, top}`` (``top``: per output token its
    ``[[token, logprob], ...]``, the top ``top_k``), or ``{id, error}``."""
    body = greedy_chat(served_name, prompt["prompt"], int(prompt.get("max_tokens") or 32))
    body.update(logprobs=True, top_logprobs=top_k)
    status, text, _secs = post(body)
    if status != 200:
        return {"id": prompt["id"], "error": f"HTTP {status or 'no answer'}: {text[:160]}"}
    try:
        content = json.loads(text)["choices"][0]["logprobs"]["content"]
        tokens = [str(c["token"]) for c in content]
        top = [[[str(t["token"]), float(t["logprob"])] for t in c.get("top_logprobs") or []] for c in content]
    except (ValueError, KeyError, IndexError, TypeError):
        return {"id": prompt["id"], "error": "no logprobs in the answer (choices[0].logprobs.content)"}
    return {"id": prompt["id"], "tokens": tokens, "top": top}


def compare_logprobs(baseline: list[dict], measured: list[dict], max_divergence: float) -> dict:
    """The canary's top-k log-probabilities against the baseline's, prompt by prompt, position by position while the
    greedy tokens agree: ``divergence`` is the mean absolute difference of the log-probabilities of the tokens in
    both top-k lists (the emitted one always), over every position compared; a prompt whose tokens part from the
    baseline's is named with the position. ``ok``: divergence at most ``max_divergence``, the tokens of at most a
    quarter of the prompts parted, every prompt answered."""
    got = {m.get("id"): m for m in measured}
    diffs: list[float] = []
    parted, errors = [], []
    for b in baseline:
        m = got.get(b.get("id")) or {"error": "not asked"}
        if m.get("error"):
            errors.append(f"{b.get('id')}: {m['error']}")
            continue
        tokens = b.get("tokens", [])
        for t in range(min(len(tokens), len(m["tokens"]))):
            want, have = tokens[t], m["tokens"][t]
            if want != have:
                parted.append(f"{b.get('id')} at token {t} ({want!r} -> {have!r})")
                break
            before, now = dict(map(tuple, b["top"][t])), dict(map(tuple, m["top"][t]))
            diffs.extend(abs(before[k] - now[k]) for k in before.keys() & now.keys())
    divergence = round(sum(diffs) / len(diffs), 6) if diffs else None
    ok = not errors and divergence is not None and divergence <= max_divergence and len(parted) <= len(baseline) // 4
    return {"ok": ok, "divergence": divergence, "max_divergence": max_divergence, "compared": len(diffs),
            "prompts": len(baseline), "parted": parted, "errors": errors}  # fmt: skip


def describe_logprobs(result: dict) -> str:
    if result.get("skipped"):
        return f"logprobs not compared: {result['skipped']}"
    words = (
        f"logprobs against the baseline: divergence {result['divergence']} over {result['compared']} token "
        f"log-probabilities of {result['prompts']} prompts (at most {result['max_divergence']:g})"
    )
    if result.get("parted"):
        words += "; the tokens parted in " + ", ".join(result["parted"][:3])
    if result.get("errors"):
        words += "; no answer: " + "; ".join(result["errors"][:3])
    if result.get("advisory"):
        return words + f" - not judged: {result['advisory']}"
    return words + (": passed" if result["ok"] else ": FAILED (the engine computes differently from its baseline)")


def gate_problems(eval_set: dict, baseline: dict, settings: GateSettings) -> list[str]:
    """Why the sequential test cannot judge a canary against ``baseline``: settings out of range, or fewer items
    the baseline answered right (overall or in a group) than the test needs to pass."""
    problems = settings.problems()
    if problems:
        return problems
    return too_few(settings, available_by_group(eval_set.get("items", []), baseline))


def baseline_record(measured: dict, key: dict, eval_set: dict, host: str, written_at: str) -> dict:
    """The baseline file's content from a measured run."""
    got = score(measured.get("items", []))
    return {
        "schema": BASELINE_SCHEMA,
        "gpu_class": key.get("gpu_class"),
        "model": key.get("model"),
        "lane": key.get("lane"),
        "eval_set": eval_set.get("name"),
        "eval_set_sha256": eval_set_digest(eval_set),
        "host": host,
        "written_at": written_at,
        "engine_version": measured.get("engine_version", ""),
        "nan_detection": measured.get("nan_detection"),
        **got,
        "items": [{"id": r.get("id"), "ok": bool(r.get("ok"))} for r in measured.get("items", [])],
        "logprobs": [x for x in measured.get("logprobs", []) if not x.get("error")],
    }


# ---------------------------------------------------------------- asking the server


def greedy_chat(served_name: str, prompt: str, max_tokens: int, thinking: bool = False) -> dict:
    """The body of one chat completion at temperature 0; without ``thinking``, GLM-4.5+/Qwen3 chat templates are
    told to write no thinking block (a template without the switch ignores it)."""
    body = {
        "model": served_name,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    if not thinking:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return body


def ask_item(post, item: dict, served_name: str, p: dict) -> dict:
    """One item through ``post(body) -> (status, text, seconds)``: ``{id, prompt, expected, match, got, ok}``
    (``error`` when there was no completion)."""
    max_tokens = int(item.get("max_tokens") or p["max_tokens"])
    body = greedy_chat(served_name, item["prompt"], max_tokens, thinking=p["thinking"])
    if p["thinking"] and p["reasoning_parser"]:
        body["max_tokens"] = max(max_tokens, int(p["reasoning_max_tokens"]))
    out = {
        "id": item["id"],
        "group": str(item.get("group") or ""),
        "prompt": item["prompt"],
        "expected": item["expected"],
        "match": item.get("match", "exact"),
        "got": "",
        "ok": False,
    }
    status, text, secs = post(body)
    out["seconds"] = round(secs, 3)
    if status != 200:
        out["error"] = f"HTTP {status or 'no answer'}: {text[:160]}"
        return out
    try:
        data = json.loads(text)
        answer, _thinking = split_message(data["choices"][0]["message"])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        out["error"] = "the answer is not an OpenAI chat completion"
        return out
    out["got"] = answer.strip()[:400]
    out["ok"], why = check_answer(item, answer)
    if why:
        out["why"] = why
    return out


def unit_environment(unit: str, runner=run) -> dict:
    """The Environment= variables of ``unit`` (systemctl show), {} when it cannot say."""
    rc, out, _err = runner(["systemctl", "show", "-p", "Environment", "--value", unit])
    if rc != 0:
        return {}
    pairs = (word.split("=", 1) for word in shlex.split(out.strip()) if "=" in word)
    return dict(pairs)


def nan_journal_lines(unit: str, patterns, runner=run) -> list[str]:
    """Lines of the running start of ``unit`` matching ``patterns`` (SGLang's NaN warning), at most 20."""
    inv = unit_state(unit, runner).get("invocation_id", "")
    if not inv:
        return []
    rx = [re.compile(x) for x in patterns]
    found = [msg.strip()[:300] for _ts, msg in journal_lines(unit, inv, runner) if any(r.search(msg) for r in rx)]
    return found[:20]


def logprob_verdict(baseline: dict, asked: list[dict], engine_version: str, p: dict) -> dict:
    """The logprob comparison of a gated run: skipped where the baseline recorded none, judged where the canary runs
    the baseline's engine version, reported but not judged where it does not (a lane or engine upgrade changes the
    kernels, so the numbers move by design: the answers decide)."""
    recorded = baseline.get("logprobs") or []
    if not recorded:
        return {"skipped": "the baseline recorded none (write it again to have them compared)"}
    if not asked:
        return {"skipped": "the evaluation set has no logprob_prompts"}
    result = compare_logprobs(recorded, asked, float(p["logprob_max_divergence"]))
    before = str(baseline.get("engine_version", ""))
    if before != engine_version:
        result["advisory"] = (
            f"the baseline's engine is {before or 'unknown'}, the canary's {engine_version or 'unknown'}"
        )
    return result


def ask_in_turn(ask, order: list[dict], gate: GateRun, concurrency: int) -> list[dict]:
    """Ask the items of ``order`` (``ask(item) -> result``), ``concurrency`` at once, feeding each answer to the
    sequential test in draw order, until it decides (or the items run out): the answers the decision used, then
    those still in flight at the decision (``counted`` false)."""
    fed: list[dict] = []
    late: list[dict] = []
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        submitted: list = []  # (item, future) in draw order, not yet fed
        nxt = 0
        while True:
            while gate.verdict is None and len(submitted) < concurrency and nxt < len(order):
                item = order[nxt]
                nxt += 1
                if gate.wanted(group_of(item)):
                    submitted.append((item, pool.submit(ask, item)))
            if not submitted:
                break
            wait([f for _i, f in submitted], return_when=FIRST_COMPLETED)
            while submitted and submitted[0][1].done():
                item, future = submitted.pop(0)
                result = future.result()
                if gate.verdict is None:
                    gate.add(group_of(item), not result.get("ok"))
                    fed.append(result)
                else:
                    late.append({**result, "counted": False})
    return fed + late


def run_eval(p: dict, no_log_values=None) -> dict:
    """Ask the evaluation set ``p['eval_set']`` (EVAL_OPTIONS; missing options take their defaults), read whether
    NaN detection is on (``/get_server_info``'s ``enable_nan_detection``, else the unit's environment) and the
    journal's NaN lines. With ``p['baseline']``: the items the baseline answered right, each group's drawn at random
    (``p['seed']``, kept in the result), asked until the sequential test decides, and the verdict; without one (a
    baseline run): every item. The API key (given, or read from the secrets file on the host) goes to
    ``no_log_values``; it is never part of the result."""
    p, base, headers = server_api(p, EVAL_OPTIONS, no_log_values)
    problems = check_eval_set(p["eval_set"])
    if problems:
        return {"failed": True, "msg": "evaluation set refused: " + "; ".join(problems), "items": []}
    settings = settings_of(p)
    if p["baseline"]:
        problems = gate_problems(p["eval_set"], p["baseline"], settings)
        if problems:
            return {"failed": True, "msg": "the quality gate cannot judge with this baseline: " + "; ".join(problems),
                    "items": []}  # fmt: skip
    started = time.monotonic()

    def post(body):
        return http("POST", base + "/v1/chat/completions", body=body, headers=headers, timeout=p["timeout"])

    status, text, _secs = http("GET", base + "/get_server_info", headers=headers, timeout=30)
    info = {}
    if status == 200:
        try:
            info = json.loads(text)
        except ValueError:
            info = {}
    if not isinstance(info, dict):
        info = {}
    items = p["eval_set"]["items"]
    seed = str(p["seed"] or f"{time.time_ns()}")

    def ask(item):
        return ask_item(post, item, p["served_name"], p)

    gate = None
    if p["baseline"]:
        by_group = available_by_group(items, p["baseline"])
        gate = GateRun(settings, by_group)
        results = ask_in_turn(ask, draw_order(by_group, random.Random(seed)), gate, int(p["concurrency"]))
    else:
        with ThreadPoolExecutor(max_workers=max(1, int(p["concurrency"]))) as pool:
            results = list(pool.map(ask, items))
    counted = [r for r in results if r.get("counted", True)]
    top_k = int(p["logprob_top_k"] or 0)
    asked_logprobs = []
    if top_k > 0 and p["eval_set"].get("logprob_prompts"):
        with ThreadPoolExecutor(max_workers=max(1, int(p["concurrency"]))) as pool:
            asked_logprobs = list(
                pool.map(lambda x: ask_logprobs(post, x, p["served_name"], top_k), p["eval_set"]["logprob_prompts"])
            )
    logprob = None
    if p["baseline"] and top_k > 0:
        logprob = logprob_verdict(p["baseline"], asked_logprobs, str(info.get("version", "")), p)
    # 0.5.9/0.5.10.post1 report the flag in /get_server_info; 0.5.23's checks are environment variables only (its
    # server info has no such field): the unit's environment says
    nan_detection = bool(info.get("enable_nan_detection")) if info else None
    if p["unit"] and not nan_detection:
        nan_detection = nan_check_on({}, unit_environment(p["unit"])) or nan_detection
    nan_lines = []
    if p["unit"] and nan_detection:
        nan_lines = nan_journal_lines(p["unit"], p["nan_patterns"])
    measured = {
        "items": counted,
        "nan_detection": nan_detection,
        "nan_lines": nan_lines,
        "engine_version": str(info.get("version", "")),
        "logprobs": asked_logprobs,
    }
    verdict = judge(measured, p["baseline"], gate, p["worst"], logprob)
    errors = [r for r in results if r.get("error")]
    written_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "baseline_record": baseline_record(measured, p["key"], p["eval_set"], p["host"], written_at),
        "changed": False,
        **verdict,
        "seed": seed,
        "eval_set": p["eval_set"].get("name"),
        "eval_set_sha256": eval_set_digest(p["eval_set"]),
        "engine_version": measured["engine_version"],
        "simulator": bool(info.get("simulator", False)),
        "info_status": status,
        "errors": len(errors),
        "items": results,
        "seconds": round(time.monotonic() - started, 3),
        "finished_at": round(time.time(), 3),
    }
