"""The rules of sglang_server_resolved_policy (docs/sglang-server.md, "The engine's resolved settings"): what one
field's rule may be, whether the value the engine resolved holds to it, and how the rule is worded in a failure.
Shared by the filter sglang_resolved_policy_problems (the policy is checked before any change) and the health check
(module_utils/sglang_server_smoke.py). Standard library only.

A rule is a plain value (the engine must resolve the field to it: the policy's first form) or a mapping of one
operator: ``{not: value}`` (anything but it), ``{in: [values]}`` (one of them), ``{not_in: [values]}`` (none of
them). Values compare as text, case-insensitively (``True`` is ``true``, ``64`` is ``"64"``), as /get_server_info's
JSON and YAML's scalars write them.
"""

from __future__ import annotations

OPERATORS = ("not", "in", "not_in")
SCALARS = (str, int, float, bool)
RULE_SHAPES = "a value (a string, number or boolean), {not: value}, {in: [values]} or {not_in: [values]}"


def rule_problem(field: str, rule) -> str | None:
    """Why ``rule`` cannot be the rule of ``field`` (a sentence naming the field and the forms a rule may take); None
    when it can."""
    if isinstance(rule, SCALARS):
        return None
    if isinstance(rule, list):
        return f"{field} must be {RULE_SHAPES}, got the list {rule!r} (for one of several values write {{in: [...]}})"
    if not isinstance(rule, dict):
        return f"{field} must be {RULE_SHAPES}, got {rule!r}"
    if len(rule) != 1 or next(iter(rule)) not in OPERATORS:
        keys = ", ".join(repr(k) for k in rule) or "none"
        return f"{field}: {rule!r} has the operator(s) {keys}; a rule has exactly one of {', '.join(OPERATORS)}"
    op, value = next(iter(rule.items()))
    if op == "not":
        if not isinstance(value, SCALARS):
            return (
                f"{field}: not takes one value (a string, number or boolean), got {value!r} (for several values write "
                "{not_in: [...]})"
            )
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, SCALARS) for v in value):
        return f"{field}: {op} takes a non-empty list of strings, numbers or booleans, got {value!r}"
    return None


def _same(a, b) -> bool:
    return str(a).lower() == str(b).lower()


def rule_holds(resolved, rule) -> bool:
    """Whether the engine's resolved value holds to a (valid) rule."""
    if not isinstance(rule, dict):
        return _same(resolved, rule)
    op, value = next(iter(rule.items()))
    if op == "not":
        return not _same(resolved, value)
    found = any(_same(resolved, v) for v in value)
    return found if op == "in" else not found


def describe_rule(rule) -> str:
    """What a rule needs, for a failure: ``'bfloat16'``, ``anything but 'fp8_e4m3'``, ``one of 'a', 'b'``, ``none of
    'a', 'b'``."""
    if not isinstance(rule, dict):
        return repr(rule)
    op, value = next(iter(rule.items()))
    if op == "not":
        return f"anything but {value!r}"
    listed = ", ".join(repr(v) for v in value)
    return f"one of {listed}" if op == "in" else f"none of {listed}"
