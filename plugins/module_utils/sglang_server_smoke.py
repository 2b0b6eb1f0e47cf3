"""The health check by generation of an SGLang server (module sglang_server_smoke, and the converged check of a
no-op deploy, module sglang_server_converged, which proves a converged host in the same run on the host): /health,
/v1/models, /get_server_info, the smoke prompts with their expectations and garbage patterns, the journal of the
running start. Standard library only; tested through both modules.
"""

from __future__ import annotations

import json
import re
import threading
import time

from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_resolved_policy import (
    describe_rule,
    rule_holds,
    rule_problem,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_http import http, server_api
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_journal import journal_lines

# The module's options and their defaults (plugins/modules/sglang_server_smoke.py documents them).
SMOKE_OPTIONS = {
    "base_url": {"type": "str", "required": True},
    "served_name": {"type": "str", "required": True},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "secrets_file": {"type": "path", "default": ""},
    "prompts": {"type": "list", "elements": "dict", "required": True},
    "reasoning_parser": {"type": "str", "default": ""},
    # no_log False: token counts, not secrets ("token" in a name looks like one)
    "reasoning_max_tokens": {"type": "int", "default": 1024, "no_log": False},
    "min_tokens_per_s": {"type": "float", "default": 0.0, "no_log": False},
    "timeout": {"type": "float", "default": 180.0},
    "garbage_patterns": {"type": "list", "elements": "str", "default": []},
    "unit": {"type": "str", "default": ""},
    "invocation_id": {"type": "str", "default": ""},
    "journal_error_patterns": {"type": "list", "elements": "str", "default": []},
    "resolved_policy": {"type": "dict", "default": {}},
}

# The engine's resolved settings kept in the deploy report (from /get_server_info, after SGLang resolved its `auto`
# values: kv_cache_dtype auto is fp8_e4m3 for a sparse-attention model on compute capability >= 10 in 0.5.9's
# server_args.py, for example). A fixed list: /get_server_info also returns the server's API keys.
RESOLVED_FIELDS = (
    "kv_cache_dtype", "dtype", "quantization", "attention_backend", "prefill_attention_backend",
    "decode_attention_backend", "nsa_prefill_backend", "nsa_decode_backend", "moe_runner_backend", "sampling_backend",
    "cuda_graph_max_bs", "disable_cuda_graph", "mem_fraction_static", "max_running_requests", "max_total_tokens",
    "chunked_prefill_size", "page_size", "context_length", "tp_size", "pp_size", "dp_size", "ep_size",
    "enable_dp_attention", "speculative_algorithm", "enable_metrics", "max_total_num_tokens",
)  # fmt: skip


def resolved_settings(info: dict) -> dict:
    """The RESOLVED_FIELDS the engine reported, as it reported them."""
    return {k: info[k] for k in RESOLVED_FIELDS if k in info}


def policy_problems(info: dict, policy: dict) -> list[str]:
    """One line per setting of ``policy`` ({field: rule}, module_utils/sglang_resolved_policy.py) the engine did not
    resolve to: names the field, what it resolved and what the policy needs."""
    problems = []
    for field, rule in (policy or {}).items():
        broken = rule_problem(field, rule)
        if broken:
            problems.append(f"sglang_server_resolved_policy: {broken}")
        elif field not in info:
            problems.append(
                f"the engine reports no {field} in /get_server_info (sglang_server_resolved_policy names it)"
            )
        elif not rule_holds(info[field], rule):
            problems.append(
                f"the engine resolved {field}={info[field]!r} where sglang_server_resolved_policy needs "
                f"{describe_rule(rule)}"
            )
    return problems


THINK_START, THINK_END = "<think>", "</think>"


def split_message(message):
    """``(answer, thinking)`` of an OpenAI chat message from SGLang, with or without a reasoning parser.

    With a parser: ``content`` is the answer (None when the budget ended inside the thinking) and
    ``reasoning_content`` the thinking. Without one the model's ``<think>...</think>`` stays in ``content``.
    """
    content = message.get("content") or ""
    thinking = message.get("reasoning_content") or ""
    if THINK_END in content:
        head, _sep, tail = content.rpartition(THINK_END)
        thinking = (thinking + "\n" if thinking else "") + head.replace(THINK_START, "").strip()
        content = tail.strip()
    elif content.lstrip().startswith(THINK_START):  # cut inside the thinking, no parser
        thinking = (thinking + "\n" if thinking else "") + content.replace(THINK_START, "").strip()
        content = ""
    return content, thinking


def check_answer(answer, expect, garbage, thinking="", finish_reason=None):
    """``(problems, warnings, answer_from)`` for one answer (see split_message)."""
    problems, warnings = [], []
    answer_from = "content"
    checked = answer or ""
    if not checked.strip() and thinking.strip():
        answer_from = "reasoning_content"
        checked = thinking
        why = " (finish_reason length: raise max_tokens)" if finish_reason == "length" else ""
        warnings.append(f"no answer after the thinking{why}; the expectation was checked on the thinking")
    if expect and not re.search(expect, checked):
        problems.append(f"answer does not match /{expect}/")
    for pattern in garbage:
        for name, text in (("answer", answer or ""), ("thinking", thinking)):
            if text and re.search(pattern, text):
                problems.append(f"{name} looks like garbage (matches /{pattern}/)")
                break
        else:
            continue
        break
    if not checked.strip():
        problems.append("empty answer")
    return problems, warnings, answer_from


def prompt_max_tokens(item, reasoning_parser, reasoning_max_tokens):
    """The prompt's max_tokens (64 when unset), at least ``reasoning_max_tokens`` for a reasoning model."""
    value = int(item.get("max_tokens") or 64)
    if reasoning_parser:
        value = max(value, int(reasoning_max_tokens))
    return value


def parse_completion(text):
    """``(answer, thinking, finish_reason, completion_tokens)`` of a chat completion body; ValueError if not one."""
    try:
        data = json.loads(text)
        choice = data["choices"][0]
        answer, thinking = split_message(choice["message"])
        tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
        return answer, thinking, choice.get("finish_reason"), tokens
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError("the answer is not an OpenAI chat completion") from exc


def run_prompt(post, item, served_name, garbage, reasoning_parser="", reasoning_max_tokens=1024, min_tokens_per_s=0):
    """Ask one smoke prompt with ``post(body) -> (status, text, seconds)``: ``(entry, problems, remarks)``.

    A budget that ends inside the thinking (no answer, finish_reason length) is asked once more with
    ``reasoning_max_tokens`` when that is larger: a reasoning model without a parser in the flags.
    """
    prompt = str(item.get("prompt", ""))
    expect = item.get("expect") or ""
    max_tokens = prompt_max_tokens(item, reasoning_parser, reasoning_max_tokens)
    remarks, problems = [], []
    while True:
        body = {
            "model": served_name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        status, text, secs = post(body)
        entry = {"prompt": prompt[:200], "expect": expect, "max_tokens": max_tokens, "status": status}
        entry["seconds"] = round(secs, 3)
        if status != 200:
            problems.append(f"HTTP {status or 'no answer'}: {text[:200]}")
            break
        try:
            answer, thinking, finish_reason, tokens = parse_completion(text)
        except ValueError as exc:
            problems.append(str(exc))
            break
        if not answer.strip() and thinking and finish_reason == "length" and max_tokens < int(reasoning_max_tokens):
            remarks.append(
                f"the budget of {max_tokens} tokens ended inside the thinking; asked again with {reasoning_max_tokens}"
            )
            max_tokens = int(reasoning_max_tokens)
            continue
        found, notes, answer_from = check_answer(answer, expect, garbage, thinking, finish_reason)
        problems += found
        remarks += notes
        shown = answer if answer_from == "content" else thinking
        entry.update(answer=shown[:300], answer_from=answer_from, finish_reason=finish_reason, tokens=tokens)
        entry["thinking_chars"] = len(thinking)
        entry["tokens_per_s"] = round(tokens / secs, 1) if secs > 0 else None
        if min_tokens_per_s and tokens and secs > 0 and tokens / secs < min_tokens_per_s:
            problems.append(f"{tokens / secs:.1f} tokens/s is below the floor of {min_tokens_per_s}")
        break
    entry["ok"] = not problems
    entry["problems"] = problems
    return entry, problems, remarks


def prove(p, no_log_values=None):
    """The checks of one server with the options ``p`` (SMOKE_OPTIONS; missing ones take their defaults): the
    module result, with ``ok``, ``failures`` and ``remarks``. The API key (given, or read from the secrets file on
    the host) is added to ``no_log_values``."""
    p, base, headers = server_api(p, SMOKE_OPTIONS, no_log_values)
    started = time.monotonic()
    failures = []

    # SGLang's /health runs a one-token generation and answers after at least one second
    # (sglang 0.5.9 http_server.health_generate: `await asyncio.sleep(1)` before it looks), so it runs
    # beside the other checks and is joined before the verdict.
    health_answer = {}

    def ask_health():
        health_answer["status"] = http("GET", base + "/health", timeout=max(p["timeout"], 30))[0]

    health_thread = threading.Thread(target=ask_health, daemon=True)
    health_thread.start()

    status, body, _secs = http("GET", base + "/v1/models", headers=headers, timeout=30)
    models = []
    if status == 200:
        try:
            models = [m.get("id") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            failures.append("/v1/models answered something that is not a model list")
        if p["served_name"] not in models:
            failures.append(f"/v1/models does not list {p['served_name']!r} (lists {models})")
    else:
        failures.append(f"/v1/models answered {status or 'nothing'}" + (" (API key refused)" if status == 401 else ""))

    version, simulator, info = "", False, {}
    status, body, _secs = http("GET", base + "/get_server_info", headers=headers, timeout=30)
    if status == 200:
        try:
            info = json.loads(body)
            version = str(info.get("version", ""))
            simulator = bool(info.get("simulator", False))
        except ValueError:
            info = {}
    if p["resolved_policy"]:
        if not isinstance(info, dict) or not info:
            failures.append(f"/get_server_info answered {status or 'nothing'}: the resolved settings cannot be checked")
        else:
            failures += policy_problems(info, p["resolved_policy"])

    results = []
    remarks = []

    def post(body):
        return http("POST", base + "/v1/chat/completions", body=body, headers=headers, timeout=p["timeout"])

    for item in p["prompts"]:
        entry, problems, notes = run_prompt(
            post,
            item,
            p["served_name"],
            p["garbage_patterns"],
            p["reasoning_parser"],
            p["reasoning_max_tokens"],
            p["min_tokens_per_s"],
        )
        results.append(entry)
        remarks += [f"prompt {entry['prompt'][:60]!r}: {n}" for n in notes]
        failures += [f"prompt {entry['prompt'][:60]!r}: {pr}" for pr in problems]

    health_thread.join()
    health = health_answer.get("status", 0)
    if health != 200:
        failures.insert(0, f"/health answered {health or 'nothing'} (expected 200)")

    journal_errors = []
    if p["unit"] and p["invocation_id"] and p["journal_error_patterns"]:
        rx = [re.compile(x) for x in p["journal_error_patterns"]]
        for _ts, msg in journal_lines(p["unit"], p["invocation_id"]):
            if any(r.search(msg) for r in rx):
                journal_errors.append(msg.strip()[:300])
        if journal_errors:
            failures.append(
                f"{len(journal_errors)} error line(s) in the journal since the start, first: {journal_errors[0]}"
            )

    result = {
        "changed": False,
        "ok": not failures,
        "failures": failures,
        "health_status": health,
        "models": models,
        "prompts": results,
        "remarks": remarks,
        "journal_errors": journal_errors[:20],
        "engine_version": version,
        "simulator": simulator,
        "resolved": resolved_settings(info) if isinstance(info, dict) else {},
        "seconds": round(time.monotonic() - started, 3),
        "finished_at": round(time.time(), 3),
    }
    return result
