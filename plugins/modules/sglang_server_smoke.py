#!/usr/bin/python
"""Ansible module: prove an SGLang server healthy by real generations."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_server_smoke
short_description: Prove the SGLang server healthy by real generations (health, models, prompts, journal)
description:
  - C(/health) must answer 200 (asked beside the other checks, since SGLang answers it after a second at the earliest)
    and C(/v1/models) must list the served model name.
  - Each smoke prompt goes to C(/v1/chat/completions); the answer must match its C(expect) regex, must not
    look like garbage (runs of C(!) or of one character or token, NaN) and must decode at least I(min_tokens_per_s).
  - Reasoning models. With a reasoning parser SGLang returns the thinking in C(reasoning_content) and the answer in
    C(content) (C(null) when the token budget ended inside the thinking); without one the C(<think>...</think>)
    block stays in C(content). The answer is C(content) after any think block; when there is none (the budget
    was spent on thinking) the expectation is checked on the thinking instead, with a warning. Garbage is looked
    for in both. With I(reasoning_parser) set every prompt gets at least I(reasoning_max_tokens) tokens.
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
  reasoning_parser:
    description: "The server's C(--reasoning-parser) (empty: none); a reasoning model thinks before it answers."
    type: str
    default: ""
  reasoning_max_tokens:
    description: "With I(reasoning_parser): the least max_tokens of a prompt (room for the thinking and the answer)."
    type: int
    default: 1024
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
  resolved_policy:
    description:
      - "Settings the engine must have resolved, C({field: rule}) of C(/get_server_info) (after SGLang resolved its
        C(auto) values, e.g. C(kv_cache_dtype)); a difference fails the check, naming the field."
      - "A rule is a value (equality) or one of C({not: value}), C({in: [values]}), C({not_in: [values]}), compared
        as text, case-insensitively; a malformed rule fails the check, naming it."
    type: dict
    default: {}
author: gpufleet maintainers (!UNKNOWN)
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
  description: >-
    Per prompt: prompt, expect, max_tokens, answer (first 300 chars), answer_from (content or reasoning_content),
    thinking_chars (length of the thinking), finish_reason, ok, tokens, seconds, tokens_per_s, problems.
  returned: always
  type: list
remarks:
  description: "Checks that passed with a remark (an answer found only in the thinking); also shown as warnings."
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
resolved:
  description: "The engine's resolved settings from /get_server_info (a fixed list of fields; never its keys)."
  returned: always
  type: dict
finished_at:
  description: "Epoch (host clock) when the checks ended."
  returned: always
  type: float
seconds:
  description: "Duration of all checks."
  returned: always
  type: float
"""


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_smoke import SMOKE_OPTIONS, prove


def main():
    module = AnsibleModule(argument_spec=SMOKE_OPTIONS, supports_check_mode=True)
    result = prove(module.params, module.no_log_values)
    for remark in result["remarks"]:
        module.warn(remark)
    if result["failures"]:
        module.fail_json(msg="health by generation failed: " + " | ".join(result["failures"]), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
