#!/usr/bin/python
"""Ansible module: score an SGLang server on an evaluation set with exact answers (the rollout's quality gate)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_quality_eval
short_description: Judge an SGLang server on exact-answer items by a sequential test against its baseline
description:
  - Asks items of I(eval_set) at temperature 0 through the server's C(/v1/chat/completions) (several at once,
    I(concurrency)), takes the answer (C(content); with a reasoning parser the thinking is C(reasoning_content) and
    not the answer) and matches it with the item's matcher, C(exact) (normalised text, or one of the item's
    C(aliases); with the item's C(script), an answer with a replacement character or letters of another script says
    so), C(numeric) (the answer's last number within the item's C(tolerance)) or C(json) (a tool call, one JSON
    object C({name, arguments}) whose arguments validate against the item's C(schema) and equal the expected ones).
  - Without I(baseline) (a baseline run) every item is asked and C(baseline_record) is the run as a baseline.
  - With I(baseline), only items the baseline answered right are asked, each item group's in a random order
    (I(seed)), the groups in turn, until a sequential probability ratio test on regressions (items the baseline
    answered right, now wrong) decides - one test over all items (a healthy regression rate I(noise) against
    I(noise) + I(allowed_drop)) and one per item group (against I(noise) + I(group_drop)), I(false_rollback) split
    between them, each with miss rate I(miss), at most I(max_items) items. C(ok) is whether every test passed;
    C(reason) names the test that failed, the regressions per group, the error rates of these settings (computed
    exactly) and the worst items (prompt, expected, got, why). docs/quality-gate.md.
  - With I(logprob_top_k), the evaluation set's fixed C(logprob_prompts) are asked with C(logprobs) at temperature 0;
    with I(baseline) their top-k log-probabilities are compared with the baseline's (RV(logprob)); a server of the
    baseline's engine version fails the verdict above I(logprob_max_divergence).
  - Reads C(/get_server_info); when the engine runs with C(--enable-nan-detection) (0.5.9, 0.5.10), or the unit's
    environment sets C(SGLANG_SANITIZE_NAN_LOGITS) or C(SGLANG_ENABLE_NAN_LOGITS_CHECK) (0.5.23), and I(unit) is
    set, the journal of the unit's running start is searched for SGLang's NaN lines (I(nan_patterns)); any such line
    fails the verdict.
  - Never changes anything and never fails on a low score (the caller acts on C(ok)); it fails only on an
    evaluation set that cannot be used. Sends an C(Authorization) Bearer header when there is an API key; the key
    is read from I(secrets_file) on the host when I(api_key) is empty, and is never in the result.
options:
  base_url:
    description: "Server URL, e.g. http://127.0.0.1:8000."
    type: str
    required: true
  served_name:
    description: "Model name the server is asked with."
    type: str
    required: true
  api_key:
    description: "API key of the server (empty = read it from I(secrets_file))."
    type: str
    default: ""
  secrets_file:
    description: "EnvironmentFile of the unit; its SGLANG_SERVER_API_KEY is used when I(api_key) is empty."
    type: path
    default: ""
  eval_set:
    description:
      - "The evaluation set: C({schema: gpufleet.quality_eval/v1, name, items: [{id, prompt, expected, match, tolerance,
        aliases, max_tokens}]}) (roles/rollout/files/quality_eval/gpufleet-eval-v2.json)."
    type: dict
    required: true
  max_tokens:
    description: "max_tokens of an item that sets none."
    type: int
    default: 32
  thinking:
    description:
      - "Let a reasoning model think (false: C(chat_template_kwargs: {enable_thinking: false}), the answer at once)."
    type: bool
    default: false
  reasoning_parser:
    description:
      - "The server's C(--reasoning-parser); with I(thinking) each item gets at least I(reasoning_max_tokens) tokens."
    type: str
    default: ""
  reasoning_max_tokens:
    description: "With I(thinking) and I(reasoning_parser): the least max_tokens of an item."
    type: int
    default: 1024
  concurrency:
    description: "Items asked at once."
    type: int
    default: 8
  timeout:
    description: "Seconds one request may take."
    type: float
    default: 120
  unit:
    description: "systemd unit of the server (NaN lines of its running start; empty = skip)."
    type: str
    default: ""
  nan_patterns:
    description: "Regexes of the journal lines that fail the verdict: SGLang 0.5.9's and 0.5.10's NaN warning, 0.5.23's
      sanitized-NaN warning (C(SGLANG_SANITIZE_NAN_LOGITS)) and its NaN assert (C(SGLANG_ENABLE_NAN_LOGITS_CHECK))."
    type: list
    elements: str
    default: ["NaN in the logits", "NaN detected in \\S.*values were sanitized", "NaN detected! "]
  baseline:
    description: "The stored baseline (C(gpufleet.quality_baseline/v1)); empty = measure only (C(ok) is null)."
    type: dict
    default: {}
  noise:
    description: "The share of the items the baseline answered right that a healthy server gets wrong (the test's H0)."
    type: float
    default: 0.01
  allowed_drop:
    description: "The accuracy drop over all items the overall test must catch (its H1 is I(noise) + I(allowed_drop))."
    type: float
    default: 0.05
  group_drop:
    description: "The accuracy drop confined to one item group each group's test must catch."
    type: float
    default: 0.25
  false_rollback:
    description: "How often a healthy server may fail the gate, at most: half to the overall test, half to the groups."
    type: float
    default: 0.02
  miss:
    description: "Each test's chance of passing a server with its drop (Wald's boundary)."
    type: float
    default: 0.04
  max_items:
    description: "The most items asked (the overall test's truncation; each group's is its share, or the items it has)."
    type: int
    default: 240
  seed:
    description: "Seed of the random draw (empty = the clock); the same seed draws the same items."
    type: str
    default: ""
  logprob_top_k:
    description:
      - "Top log-probabilities per token asked for the evaluation set's C(logprob_prompts) (temperature 0): a baseline
        run records them in RV(baseline_record); with I(baseline) they are compared with the baseline's. 0 = no
        comparison."
    type: int
    default: 5
  logprob_max_divergence:
    description:
      - "The most mean absolute difference between the log-probabilities of the tokens in both top-k lists, position by
        position while the greedy tokens agree, for a server of the baseline's engine version (another version's is
        reported, not judged)."
    type: float
    default: 0.02
  worst:
    description: "How many failed items the verdict names."
    type: int
    default: 5
  key:
    description: "C({gpu_class, model, lane}) of the host, written into RV(baseline_record)."
    type: dict
    default: {}
  host:
    description: "The host's inventory name, written into RV(baseline_record)."
    type: str
    default: ""
author: gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Score the canary against its baseline
  gpufleet.fleet.sglang_quality_eval:
    base_url: http://127.0.0.1:8000
    served_name: glm-5
    secrets_file: /etc/sglang-server/secrets.env
    eval_set: "{{ lookup('ansible.builtin.file', 'quality_eval/gpufleet-eval-v2.json') | from_json }}"
    baseline: "{{ lookup('ansible.builtin.file', baseline_path) | from_json }}"
    seed: "{{ rollout_run_id }}"
    unit: sglang-server.service
  register: quality
"""

RETURN = r"""
ok:
  description: "The verdict: every sequential test passed and no NaN line; null without a baseline."
  returned: always
  type: bool
reason:
  description: "The test that decided, the regressions per group, the error rates, NaN lines, the worst items."
  returned: always
  type: str
score:
  description: "Share of exact answers among the items the decision used (0-1)."
  returned: always
  type: float
correct:
  description: "Items answered exactly (of those the decision used)."
  returned: always
  type: int
total:
  description: "Items the decision used (answers still in flight at the decision are in RV(items), C(counted) false)."
  returned: always
  type: int
baseline_score:
  description: "The baseline's score (null without one)."
  returned: always
  type: float
decision:
  description:
    - "Per test (C(all) and each group): items, regressions, decided_after, regressions_then, verdict, healthy_rate,
      degraded_rate, alpha, max_items."
  returned: always
  type: dict
failed_group:
  description: "The test that failed: a group's name, or C(all) (null when none failed)."
  returned: always
  type: str
rates:
  description:
    - "Error rates of these settings, computed exactly: false_rollback, detection, group_detection,
      expected_items_healthy."
  returned: always
  type: dict
seed:
  description: "The seed of the random draw."
  returned: always
  type: str
logprob:
  description:
    - "The logprob comparison: ok, divergence, max_divergence, compared, prompts, parted (prompts whose tokens parted
      from the baseline's, with the position), errors, advisory (why it is not judged); or skipped (why not compared);
      empty without a baseline or with I(logprob_top_k) 0."
  returned: always
  type: dict
worst:
  description: "Failed items, regressions first: id, group, prompt, expected, got, why."
  returned: always
  type: list
items:
  description:
    - "Every item asked: id, group, prompt, expected, match, got, ok, why, seconds (error when there was no
      completion)."
  returned: always
  type: list
nan_detection:
  description: "The engine runs with --enable-nan-detection (from /get_server_info; null when it did not answer)."
  returned: always
  type: bool
nan_lines:
  description: "Journal lines of the running start matching nan_patterns."
  returned: always
  type: list
eval_set:
  description: "Name of the evaluation set."
  returned: always
  type: str
eval_set_sha256:
  description: "sha256 of its items (a baseline is comparable only with the same items)."
  returned: always
  type: str
engine_version:
  description: "version from /get_server_info."
  returned: always
  type: str
baseline_record:
  description:
    - "This run as a baseline file (C(gpufleet.quality_baseline/v1)): gpu_class, model, lane (I(key)), eval_set,
      eval_set_sha256, host, written_at, engine_version, nan_detection, score, correct, total, items (id, ok)."
  returned: always
  type: dict
errors:
  description: "Items that got no completion (HTTP error, no answer)."
  returned: always
  type: int
seconds:
  description: "Duration of the run."
  returned: always
  type: float
"""


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_quality_eval import EVAL_OPTIONS, run_eval


def main():
    module = AnsibleModule(argument_spec=EVAL_OPTIONS, supports_check_mode=True)
    result = run_eval(module.params, module.no_log_values)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
