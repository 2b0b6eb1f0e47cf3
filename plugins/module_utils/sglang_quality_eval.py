"""The quality gate of a rollout's canary (module sglang_quality_eval; docs/quality-gate.md): an evaluation set of
items with exact answers (roles/rollout/files/quality_eval/), asked at temperature 0 through the server's OpenAI
API, each answer normalised and matched (``exact`` or ``numeric``), the score (the share of exact answers), the
journal of the running start searched for SGLang's NaN line, and the verdict against a stored baseline of the same
GPU class, model and lane. Standard library only; unit-tested with fakes and against the lab's simulated engine.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_command import run
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_http import http, server_api
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_journal import journal_lines
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_smoke import split_message
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_systemd import unit_state

EVAL_SCHEMA = "gpufleet.quality_eval/v1"
BASELINE_SCHEMA = "gpufleet.quality_baseline/v1"
MATCHERS = ("exact", "numeric")
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
    "allowed_drop": {"type": "float", "default": 0.05},
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
        elif matcher == "numeric":
            try:
                float(expected)
            except (TypeError, ValueError):
                problems.append(f"{where}: numeric expected answer {expected!r} is not a number")
        tol = item.get("tolerance", 0)
        if not isinstance(tol, (int, float)) or isinstance(tol, bool) or tol < 0:
            problems.append(f"{where}: tolerance must be a number >= 0 (got {tol!r})")
    return problems


def eval_set_digest(data: dict) -> str:
    """sha256 of the items as canonical JSON: a baseline is only comparable with a run of the same items."""
    canon = json.dumps(data.get("items", []), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
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


def matches(item: dict, answer) -> bool:
    """Whether ``answer`` is the item's expected answer by its matcher: ``exact`` (normalised text equal to the
    expected answer or one of its ``aliases``) or ``numeric`` (the answer's last number within ``tolerance`` of the
    expected number; 0 = equal up to float rounding)."""
    if item.get("match", "exact") == "numeric":
        got = extract_number(answer)
        if got is None:
            return False
        want = float(item["expected"])
        tol = float(item.get("tolerance", 0) or 0)
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=max(tol, 1e-9))
    wanted = {normalise(item["expected"])} | {normalise(a) for a in item.get("aliases", [])}
    return normalise(answer) in wanted


# ---------------------------------------------------------------- score, worst items, verdict


def score(results: list[dict]) -> dict:
    """``{correct, total, score}``: the share of exact answers (0.0 for no item)."""
    total = len(results)
    correct = sum(1 for r in results if r.get("ok"))
    return {"correct": correct, "total": total, "score": round(correct / total, 4) if total else 0.0}


def worst_items(results: list[dict], baseline: dict | None = None, limit: int = 5) -> list[dict]:
    """The failed items a person should look at first: those the baseline answered right (a regression), then the
    others, each as ``{id, prompt, expected, got}`` (``got`` cut at 120 characters)."""
    passed_before = {r.get("id") for r in (baseline or {}).get("items", []) if r.get("ok")}
    failed = [r for r in results if not r.get("ok")]
    failed.sort(key=lambda r: (r.get("id") not in passed_before, str(r.get("id"))))
    return [
        {
            "id": r.get("id"),
            "prompt": r.get("prompt"),
            "expected": r.get("expected"),
            "got": str(r.get("got") or r.get("error") or "")[:120],
        }
        for r in failed[: max(0, int(limit))]
    ]


def describe_worst(worst: list[dict]) -> str:
    return "; ".join(f"[{w['id']}] {w['prompt']!r}: expected {w['expected']!r}, got {w['got']!r}" for w in worst)


def judge(measured: dict, baseline: dict, allowed_drop: float, worst_limit: int = 5) -> dict:
    """The verdict of a run against its baseline: ``ok`` when the score is at least ``baseline score -
    allowed_drop``, NaN lines in the journal fail it whatever the score; ``reason`` names the score, the baseline,
    the floor and the worst items. ``baseline`` empty: ``ok`` None (measured only: a baseline run)."""
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
    }
    nan = measured.get("nan_lines") or []
    if not baseline:
        verdict.update(ok=None, baseline_score=None, floor=None, reason=f"score {got['score']:.3f} measured")
        return verdict
    base = float(baseline.get("score", 0))
    floor = round(base - float(allowed_drop), 4)
    ok = got["score"] >= floor - 1e-9 and not nan
    parts = [
        f"score {got['score']:.3f} ({got['correct']}/{got['total']} exact) against the baseline {base:.3f} "
        f"({baseline.get('correct', '?')}/{baseline.get('total', '?')}, {baseline.get('written_at', 'undated')}, "
        f"host {baseline.get('host', '?')}); floor {floor:.3f} (allowed drop {float(allowed_drop):.3f})"
    ]
    if nan:
        parts.append(f"{len(nan)} NaN line(s) in the engine's journal since its start, first: {nan[0]}")
    if worst:
        parts.append("worst items: " + describe_worst(worst))
    verdict.update(ok=ok, baseline_score=base, floor=floor, reason="; ".join(parts))
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
    }


# ---------------------------------------------------------------- asking the server


def ask_item(post, item: dict, served_name: str, p: dict) -> dict:
    """One item through ``post(body) -> (status, text, seconds)``: ``{id, prompt, expected, match, got, ok}``
    (``error`` when there was no completion)."""
    max_tokens = int(item.get("max_tokens") or p["max_tokens"])
    body = {
        "model": served_name,
        "messages": [{"role": "user", "content": item["prompt"]}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    if p["thinking"]:
        if p["reasoning_parser"]:
            body["max_tokens"] = max(max_tokens, int(p["reasoning_max_tokens"]))
    else:
        # GLM-4.5+/Qwen3 chat templates: no thinking block (a template without the switch ignores it)
        body["chat_template_kwargs"] = {"enable_thinking": False}
    out = {
        "id": item["id"],
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
    out["ok"] = matches(item, answer)
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


def run_eval(p: dict, no_log_values=None) -> dict:
    """Ask every item of ``p['eval_set']`` (EVAL_OPTIONS; missing options take their defaults), score it, read
    whether NaN detection is on (``/get_server_info``'s ``enable_nan_detection``) and the journal's NaN lines,
    and judge it against ``p['baseline']`` when one is given. The API key (given, or read from the secrets file on
    the host) goes to ``no_log_values``; it is never part of the result."""
    p, base, headers = server_api(p, EVAL_OPTIONS, no_log_values)
    problems = check_eval_set(p["eval_set"])
    if problems:
        return {"failed": True, "msg": "evaluation set refused: " + "; ".join(problems), "items": []}
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
    with ThreadPoolExecutor(max_workers=max(1, int(p["concurrency"]))) as pool:
        results = list(pool.map(lambda it: ask_item(post, it, p["served_name"], p), items))
    # 0.5.9/0.5.10.post1 report the flag in /get_server_info; 0.5.23's checks are environment variables only (its
    # server info has no such field): the unit's environment says
    nan_detection = bool(info.get("enable_nan_detection")) if info else None
    if p["unit"] and not nan_detection:
        nan_detection = nan_check_on({}, unit_environment(p["unit"])) or nan_detection
    nan_lines = []
    if p["unit"] and nan_detection:
        nan_lines = nan_journal_lines(p["unit"], p["nan_patterns"])
    measured = {
        "items": results,
        "nan_detection": nan_detection,
        "nan_lines": nan_lines,
        "engine_version": str(info.get("version", "")),
    }
    verdict = judge(measured, p["baseline"], p["allowed_drop"], p["worst"])
    errors = [r for r in results if r.get("error")]
    written_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "baseline_record": baseline_record(measured, p["key"], p["eval_set"], p["host"], written_at),
        "changed": False,
        **verdict,
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
