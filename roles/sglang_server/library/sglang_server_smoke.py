#!/usr/bin/python
"""Ansible module: prove an SGLang server healthy by real generations."""

from __future__ import annotations

import json
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_server_host import http, journal_lines

DOCUMENTATION = r"""
module: sglang_server_smoke
short_description: Prove the SGLang server healthy by real generations (health, models, prompts, journal)
description:
  - C(/health) must answer 200 and C(/v1/models) must list the served model name.
  - Each smoke prompt goes to C(/v1/chat/completions); the answer must match its C(expect) regex, must not
    look like garbage (NaN, runs of one character or token) and must decode at least I(min_tokens_per_s).
  - The journal of this start of the unit must hold no error line (Traceback, CUDA error, NaN in the logits).
  - Reads C(/get_server_info) for the engine version. Sends an C(Authorization) Bearer header when there is an API key.
options:
  base_url:
    description: "Server URL, e.g. http://127.0.0.1:8000."
    type: str
    required: true
  served_name:
    description: "Model name the server must list and is asked with."
    type: str
    required: true
  api_key:
    description: "API key of the server (empty = read it from I(secrets_file))."
    type: str
    default: ""
    no_log: true
  secrets_file:
    description: >-
      EnvironmentFile of the unit; its SGLANG_SERVER_API_KEY is used when I(api_key) is empty,
      so the key never passes through Ansible.
    type: path
    default: ""
  prompts:
    description: "List of {prompt, expect (regex), max_tokens}."
    type: list
    elements: dict
    required: true
  min_tokens_per_s:
    description: "Minimum completion tokens per second of each prompt (0 = no floor)."
    type: float
    default: 0
  timeout:
    description: "Seconds one request may take."
    type: float
    default: 180
  garbage_patterns:
    description: "Regexes that mark an answer as garbage."
    type: list
    elements: str
    default: []
  unit:
    description: "systemd unit (journal check)."
    type: str
    default: ""
  invocation_id:
    description: "InvocationID of the running start (journal check; empty = skip)."
    type: str
    default: ""
  journal_error_patterns:
    description: "Regexes of journal lines that fail the check."
    type: list
    elements: str
    default: []
author: gpufleet
"""

EXAMPLES = r"""
- name: Prove health by generation
  sglang_server_smoke:
    base_url: http://127.0.0.1:8000
    served_name: glm-5
    api_key: "{{ sglang_server_api_key }}"
    prompts:
      - {prompt: "What is the capital of France?", expect: "(?i)paris", max_tokens: 64}
  no_log: false
"""

RETURN = r"""
ok:
  description: "Every check passed."
  returned: always
  type: bool
failures:
  description: "One line per failed check."
  returned: always
  type: list
health_status:
  description: "HTTP status of /health."
  returned: always
  type: int
models:
  description: "Model ids listed by /v1/models."
  returned: always
  type: list
prompts:
  description: "Per prompt: prompt, expect, answer (first 300 chars), ok, tokens, seconds, tokens_per_s, problems."
  returned: always
  type: list
journal_errors:
  description: "Journal lines of this start matching an error pattern."
  returned: always
  type: list
engine_version:
  description: "version from /get_server_info."
  returned: always
  type: str
simulator:
  description: "The engine says it is the lab simulator."
  returned: always
  type: bool
finished_at:
  description: "Epoch (host clock) when the checks ended."
  returned: always
  type: float
seconds:
  description: "Duration of all checks."
  returned: always
  type: float
"""


def read_env_file(path):
    """KEY="value" lines of a systemd EnvironmentFile written by the role (backslash escapes)."""
    values = {}
    if not path:
        return values
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return values
    for line in lines:
        m = re.match(r'^([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*$', line)
        if m:
            values[m.group(1)] = re.sub(r"\\(.)", r"\1", m.group(2))
    return values


def check_answer(answer, expect, garbage):
    problems = []
    if expect and not re.search(expect, answer or ""):
        problems.append(f"answer does not match /{expect}/")
    for pattern in garbage:
        if re.search(pattern, answer or ""):
            problems.append(f"answer looks like garbage (matches /{pattern}/)")
            break
    if not (answer or "").strip():
        problems.append("empty answer")
    return problems


def main():
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "served_name": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "secrets_file": {"type": "path", "default": ""},
            "prompts": {"type": "list", "elements": "dict", "required": True},
            "min_tokens_per_s": {"type": "float", "default": 0.0},
            "timeout": {"type": "float", "default": 180.0},
            "garbage_patterns": {"type": "list", "elements": "str", "default": []},
            "unit": {"type": "str", "default": ""},
            "invocation_id": {"type": "str", "default": ""},
            "journal_error_patterns": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    base = p["base_url"].rstrip("/")
    api_key = p["api_key"] or read_env_file(p["secrets_file"]).get("SGLANG_SERVER_API_KEY", "")
    if api_key:
        module.no_log_values.add(api_key)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.monotonic()
    failures = []

    health, _body, _secs = http("GET", base + "/health", timeout=max(p["timeout"], 30))
    if health != 200:
        failures.append(f"/health answered {health or 'nothing'} (expected 200)")

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

    version, simulator = "", False
    status, body, _secs = http("GET", base + "/get_server_info", headers=headers, timeout=30)
    if status == 200:
        try:
            info = json.loads(body)
            version = str(info.get("version", ""))
            simulator = bool(info.get("simulator", False))
        except ValueError:
            pass

    results = []
    for item in p["prompts"]:
        prompt = str(item.get("prompt", ""))
        expect = item.get("expect") or ""
        max_tokens = int(item.get("max_tokens") or 64)
        body = {
            "model": p["served_name"],
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        status, text, secs = http(
            "POST", base + "/v1/chat/completions", body=body, headers=headers, timeout=p["timeout"]
        )
        entry = {"prompt": prompt[:200], "expect": expect, "status": status, "seconds": round(secs, 3)}
        problems = []
        if status != 200:
            problems.append(f"HTTP {status or 'no answer'}: {text[:200]}")
        else:
            try:
                data = json.loads(text)
                msg = data["choices"][0]["message"]
                answer = (msg.get("content") or "") + (
                    ("\n" + msg["reasoning_content"]) if not msg.get("content") and msg.get("reasoning_content") else ""
                )
                tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
            except (ValueError, KeyError, IndexError, TypeError):
                answer, tokens = "", 0
                problems.append("the answer is not an OpenAI chat completion")
            entry.update(answer=answer[:300], tokens=tokens)
            entry["tokens_per_s"] = round(tokens / secs, 1) if secs > 0 else None
            problems += check_answer(answer, expect, p["garbage_patterns"])
            if p["min_tokens_per_s"] and tokens and secs > 0 and tokens / secs < p["min_tokens_per_s"]:
                problems.append(f"{tokens / secs:.1f} tokens/s is below the floor of {p['min_tokens_per_s']}")
        entry["ok"] = not problems
        entry["problems"] = problems
        results.append(entry)
        failures += [f"prompt {prompt[:60]!r}: {pr}" for pr in problems]

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
        "journal_errors": journal_errors[:20],
        "engine_version": version,
        "simulator": simulator,
        "seconds": round(time.monotonic() - started, 3),
        "finished_at": round(time.time(), 3),
    }
    if failures:
        module.fail_json(msg="health by generation failed: " + " | ".join(failures), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
