"""Filters of the sglang_server role: SGLang server flags as data -> argv, exact-flag checks, systemd quoting.

Unit-tested in tests/unit/sglang_server/. Pure Python (no Ansible import needed to test them).
"""

from __future__ import annotations

import difflib
import json
import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_args_table import load_table, table_version
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_help import help_options
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_resolved_policy import rule_problem
from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_server_journal import journal_match
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.filter_errors import as_filter_error

SECRET_OPTIONS = {"--api-key": "sglang_server_api_key", "--admin-api-key": "sglang_server_api_key"}
# Options that are the engine's own business in the role (the role adds them itself).
ROLE_OPTIONS = {"--config": "the role passes --config itself (secret arguments file)"}
SAFE_ARG_RE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


class SglangArgsError(ValueError):
    """Bad server flags; the message names the option and the fix."""


def _option(key) -> str:
    key = str(key).strip()
    if not key:
        raise SglangArgsError("an SGLang option name is empty")
    return key if key.startswith("--") else "--" + key


def _is_omitted(value) -> bool:
    return value is None or value is False or (isinstance(value, (list, tuple)) and len(value) == 0)


def _scalar(opt: str, value) -> str:
    if isinstance(value, bool):  # only reached for list items
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if text == "" or "\n" in text:
        raise SglangArgsError(f"{opt}: empty or multi-line value {value!r}")
    return text


def sglang_argv(args, table_path=None) -> list[str]:
    """Render the merged server flags (option -> value) into argv (without the python -m MODULE part)."""
    if args is None:
        return []
    if not isinstance(args, dict):
        raise SglangArgsError(f"the server flags must be a mapping of option -> value, got {type(args).__name__}")
    table = load_table(table_path)
    argv: list[str] = []
    seen_dest: dict[str, str] = {}
    for key, value in args.items():
        opt = _option(key)
        if _is_omitted(value):
            continue
        if opt in SECRET_OPTIONS:
            raise SglangArgsError(
                f"{opt} is a secret and must not be a server flag (it would show in the unit and in `ps`): "
                f"set {SECRET_OPTIONS[opt]} instead, it reaches SGLang through --config in the runtime directory"
            )
        if opt in ROLE_OPTIONS:
            raise SglangArgsError(f"{opt}: {ROLE_OPTIONS[opt]}; remove it from the server flags")
        entry = table.get(opt)
        kind = entry["kind"] if entry else None
        if entry:
            dest = entry["dest"]
            if dest in seen_dest:
                raise SglangArgsError(
                    f"{seen_dest[dest]} and {opt} are the same SGLang option ({dest}): keep one spelling "
                    "(set the other to null in the layer that overrides it)"
                )
            seen_dest[dest] = opt
        if kind == "deprecated":
            # sglang's DeprecatedAction only logs a warning and stores nothing (0.5.9 server_args.py:5729-5738,
            # 0.5.10.post1 server_args.py:6673-6682; 0.5.23's parser has none): the engine starts and ignores the
            # flag, and one given a value (nargs=0) makes its parser exit. Refused either way: it does nothing.
            version = table_version(table_path)
            raise SglangArgsError(
                f"{opt} is deprecated in SGLang {version}: the engine only logs a warning and ignores it "
                "(its parser exits if it is given a value): remove it"
            )
        if value is True:
            if kind not in (None, "flag", "optional"):
                raise SglangArgsError(f"{opt} takes a value ({kind}), got true: give it a value")
            argv.append(opt)
            continue
        if kind == "flag":
            raise SglangArgsError(f"{opt} is a switch: set it to true (present) or false/null (absent), got {value!r}")
        if isinstance(value, (list, tuple)):
            if kind not in (None, "list"):
                raise SglangArgsError(f"{opt} takes one value, got a list {list(value)!r}")
            argv.append(opt)
            argv.extend(_scalar(opt, item) for item in value)
            continue
        text = _scalar(opt, value)
        if entry and entry.get("choices") and text not in [str(c) for c in entry["choices"]]:
            raise SglangArgsError(
                f"{opt}={text!r} is not one of its choices: {', '.join(str(c) for c in entry['choices'])}"
            )
        argv.extend([opt, text])
    return argv


def sglang_rendered_options(args) -> list[str]:
    """Option strings (``--x``) that the merged flags render (omitted ones left out)."""
    if not isinstance(args, dict):
        return []
    return [_option(k) for k, v in args.items() if not _is_omitted(v)]


def sglang_help_options(help_text) -> list[str]:
    """Every option string printed by ``python -m <module> --help`` (module_utils/sglang_help.py)."""
    return help_options(help_text)


def sglang_resolved_policy_problems(policy, table_path=None) -> list[str]:
    """What is wrong with sglang_server_resolved_policy ({GPU class or '*': {field: rule}}): one line per problem,
    naming the entry; a field must be one of SGLang 0.5.9's server arguments (the pinned table, written as
    /get_server_info names it: kv_cache_dtype for --kv-cache-dtype), a rule a string, number or boolean (equality) or
    one of {not: value}, {in: [values]}, {not_in: [values]} (module_utils/sglang_resolved_policy.py)."""
    if not isinstance(policy, dict):
        shape = "{GPU class or '*': {field: value}}"
        return [f"sglang_server_resolved_policy must be a mapping {shape}, got {policy!r}"]
    table = load_table(table_path)
    fields = {entry["dest"] for entry in table.values() if entry.get("dest")}
    problems = []
    for cls, wanted in policy.items():
        where = f"sglang_server_resolved_policy[{cls!r}]"
        if not isinstance(wanted, dict):
            problems.append(f"{where} must be a mapping {{field: value}}, got {wanted!r}")
            continue
        for field, value in wanted.items():
            if field not in fields:
                hint = " (written with dashes: use the /get_server_info name)" if "-" in str(field) else ""
                problems.append(f"{where}: {field!r} is no server argument of SGLang 0.5.9{hint}")
            elif rule_problem(field, value):
                problems.append(f"{where}: {rule_problem(field, value)}")
    return problems


def sglang_flag_problems(args, help_options, where="the installed engine") -> list[str]:
    """Messages for rendered options that are not exact option strings of the engine's --help.

    SGLang's argparse accepts unambiguous prefixes (``--tp`` for ``--tp-size``); gpufleet does not, so a
    typo never silently means another option.
    """
    known = set(help_options or [])
    problems = []
    for opt in sglang_rendered_options(args):
        if opt in known:
            continue
        close = difflib.get_close_matches(opt, sorted(known), n=3, cutoff=0.6)
        prefixed = sorted(o for o in known if o.startswith(opt))
        hint = ""
        if len(prefixed) == 1:
            hint = f" (SGLang would read it as the abbreviation of {prefixed[0]}: write that exactly)"
            close = [prefixed[0]] + [c for c in close if c != prefixed[0]]
        elif "_" in opt and opt.replace("_", "-") in known:
            close = [opt.replace("_", "-")]
        suggestion = f"; did you mean {' or '.join(close)}?" if close else ""
        problems.append(f"{opt} is not an option of {where}{hint}{suggestion}")
    return problems


def sglang_arg(args, option, default=None, table_path=None):
    """The value of one option in the merged flags, whatever spelling (alias) the inventory used."""
    if not isinstance(args, dict):
        return default
    table = load_table(table_path)
    want = table.get(_option(option))
    for key, value in args.items():
        opt = _option(key)
        entry = table.get(opt)
        same = opt == _option(option) or (want and entry and entry["dest"] == want["dest"])
        if same and not _is_omitted(value):
            return value
    return default


def sglang_flag_layer(layers, option, table_path=None) -> str:
    """The flag layer (``{layer variable: mapping}``, lowest first, as sglang_merge_flags takes them) whose value of
    ``option`` (any spelling) the merged flags hold: the highest layer that sets it. A message about the value then
    names the variable to fix, not ``sglang_server_args_*``; ``sglang_server_args_*`` when no layer sets it."""
    found = "sglang_server_args_*"
    for name, layer in (layers or {}).items():
        if isinstance(layer, dict) and sglang_arg(layer, option, None, table_path) is not None:
            found = name
    return found


def sglang_merge_flags(layers, table_path=None) -> dict:
    """The one merge of the inventory's flag layers (``{layer variable: mapping}``, lowest first).

    Keys lose a leading ``--``. A layer's option replaces whatever spelling of the same SGLang option a
    lower layer used (``tensor-parallel-size`` over ``tp-size``); ``null`` removes it. Refused, naming the
    layer: a layer that is not a mapping, two spellings of one option in one layer. A key that is no option
    (a typo, an abbreviation such as ``tp``) is kept as written: the role's validate_inputs reports it with
    every other problem of the flags at once (sglang_flag_problems against the pinned table, then against the
    engine's own --help), so the layout never reads it.
    """
    if not isinstance(layers, dict):
        raise SglangArgsError("sglang_merge_flags needs {layer variable: mapping}, lowest layer first")
    table = load_table(table_path)
    merged: dict = {}
    for name, layer in layers.items():
        if layer is None:
            continue
        if not isinstance(layer, dict):
            raise SglangArgsError(
                f"{name} must be a mapping of SGLang option (no --) -> value, got {type(layer).__name__}: "
                f"fix {name} in the inventory"
            )
        seen: dict[str, str] = {}
        for key, value in layer.items():
            opt = _option(key)
            flag = opt[2:]
            entry = table.get(opt)
            dest = entry["dest"] if entry else opt
            if dest in seen:
                raise SglangArgsError(
                    f"{name} sets one SGLang option twice ({seen[dest]} and {flag}): keep one spelling in {name}"
                )
            seen[dest] = flag
            for old in [k for k in merged if (table.get(_option(k)) or {}).get("dest", _option(k)) == dest]:
                del merged[old]
            if value is not None:
                merged[flag] = value
    return merged


_PARALLEL = (("tp", "tp-size"), ("pp", "pp-size"), ("dp", "dp-size"), ("nnodes", "nnodes"))


def sglang_parallel(flags, table_path=None) -> dict:
    """The server's parallel layout, read once from the merged flags; every reader uses this.

    ``{tp, pp, dp, nnodes, dp_attention, world, per_node, options, problems}``: ``world`` is the GPUs of the
    whole server (tp x pp, x dp unless dp-attention shares the tp GPUs), ``per_node`` its share on each of
    the ``nnodes`` hosts, ``options`` the spelling the inventory used (for messages), ``problems`` what is
    wrong (a value that is not a positive integer, a world not divisible by nnodes), each naming the flag.
    """
    flags = flags if isinstance(flags, dict) else {}
    table = load_table(table_path)
    out: dict = {"options": {}, "problems": []}
    for name, option in _PARALLEL:
        want = table.get(_option(option))
        spelled = option
        for key in flags:
            entry = table.get(_option(key))
            if _option(key) == _option(option) or (want and entry and entry["dest"] == want["dest"]):
                spelled = str(key).lstrip("-")
        raw = sglang_arg(flags, option, 1, table_path)
        out["options"][name] = spelled
        try:
            value = int(raw)
            if isinstance(raw, bool) or value < 1 or (isinstance(raw, float) and raw != value):
                raise ValueError
        except (TypeError, ValueError):
            out["problems"].append(f"{spelled}={raw!r} must be a positive integer (sglang_server_args_*.{spelled})")
            value = 1
        out[name] = value
    out["dp_attention"] = bool(sglang_arg(flags, "enable-dp-attention", False, table_path))
    out["world"] = out["tp"] * out["pp"] * (1 if out["dp_attention"] else out["dp"])
    if out["world"] % out["nnodes"]:
        o = out["options"]
        out["problems"].append(
            f"{o['tp']} x {o['pp']} = {out['world']} GPUs is not divisible by {o['nnodes']}={out['nnodes']}: "
            f"choose {o['tp']} x {o['pp']} as a multiple of {out['nnodes']} (sglang_server_args_*)"
        )
    out["per_node"] = max(out["world"] // out["nnodes"], 1)
    return out


def sglang_gpu_indices(args, gpu_count, table_path=None) -> list[int]:
    """GPU indices the server will use on this host: base-gpu-id .. + tp*pp(*dp)/nnodes (gpu-id-step apart)."""

    def num(name, dflt):
        try:
            return int(sglang_arg(args, name, dflt, table_path))
        except (TypeError, ValueError):
            return dflt

    local = sglang_parallel(args, table_path)["per_node"]
    base, step = num("base-gpu-id", 0), max(num("gpu-id-step", 1), 1)
    indices = [base + i * step for i in range(local)]
    count = int(gpu_count or 0)
    return [i for i in indices if i < count] if count else indices


def systemd_exec_args(argv) -> str:
    """Quote argv for ExecStart=: specifiers (%) and variables ($) are escaped, so values are literal."""
    out = []
    for arg in argv:
        arg = str(arg)
        if SAFE_ARG_RE.match(arg) and "%" not in arg:
            out.append(arg)
            continue
        escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
        out.append(f'"{escaped}"')
    return " ".join(out)


def systemd_environment(env) -> list[str]:
    """``Environment=`` values (one quoted KEY=value per line), sorted by name; null values dropped."""
    lines = []
    for key in sorted(env or {}):
        value = env[key]
        if value is None:
            continue
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
            raise SglangArgsError(f"environment variable name {key!r} is invalid")
        if isinstance(value, bool):
            value = "1" if value else "0"
        text = str(value)
        if "\n" in text:
            raise SglangArgsError(f"environment variable {key} has a multi-line value")
        text = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        lines.append(f'"{key}={text}"')
    return lines


def env_file_line(key, value) -> str:
    """One line of an EnvironmentFile (systemd's syntax: double quotes, backslash escapes)."""
    text = "" if value is None else str(value)
    if "\n" in text:
        raise SglangArgsError(f"{key}: multi-line secret")
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return f'{key}="{text}"'


# The ExecStartPre program that writes the API key into the YAML file SGLang's --config reads. SGLang 0.5.9
# reads that file with yaml.safe_load (server_args_config_parser.ConfigArgumentMerger._parse_yaml_config),
# which types plain scalars (00017 -> 15, yes -> true, "a #b" -> "a", "*k" -> error), so the key is written
# as a YAML single-quoted scalar: every character stands for itself there, only ' is doubled. It runs under
# the release's python with the key in its environment (from the EnvironmentFile), never in an argv.
API_KEY_CONFIG_WRITER = (
    "import os, sys; key = os.environ['SGLANG_SERVER_API_KEY']; os.umask(0o077); "
    "open(sys.argv[1], 'w', encoding='utf-8').write(\"api-key: '\" + key.replace(\"'\", \"''\") + \"'\\n\")"
)


def yaml_single_quoted(value) -> str:
    """``value`` as a YAML single-quoted scalar (what API_KEY_CONFIG_WRITER writes)."""
    return "'" + str(value).replace("'", "''") + "'"


def sglang_api_key_config_writer(_unused=None) -> str:
    """The python source of the ExecStartPre that writes ``api-key: '<key>'`` (see API_KEY_CONFIG_WRITER)."""
    return API_KEY_CONFIG_WRITER


def sglang_api_key_problem(key) -> str:
    """Why SGLang 0.5.9 could never accept ``key`` as its API key ('' = it can). Never quotes the key.

    * Non-ASCII: 0.5.9 compares with ``secrets.compare_digest(str, str)`` (utils/auth.py
      ``decide_request_auth``), which raises TypeError for non-ASCII strings: every request with a Bearer
      header then fails with 500. Control characters cannot be sent in an HTTP header at all.
    * Trailing whitespace: HTTP servers strip it from header values, so the sent key loses it.
    * A leading ``-``: argparse may read ``--api-key -x`` as a missing value (exit 2); refused as a whole.
    """
    text = "" if key is None else str(key)
    if not text:
        return ""
    return _api_key_why(text) and (_api_key_why(text) + API_KEY_FIX)


# What every refusal of a key says to do instead (the key itself is never shown).
API_KEY_FIX = (
    ". Fix: choose another key of printable ASCII that does not start with '-' (e.g. the output of "
    '`openssl rand -hex 32`) and keep it in a vault: sglang_server_api_key: "{{ vault_sglang_server_api_key }}"'
)


def _api_key_why(text: str) -> str:
    for i, ch in enumerate(text):
        if ord(ch) > 0x7E:
            return (
                f"sglang_server_api_key has a non-ASCII character at position {i + 1}: SGLang 0.5.9 compares keys "
                "with secrets.compare_digest, which refuses non-ASCII text (every request would fail with 500)"
            )
        if ord(ch) < 0x20:
            return (
                f"sglang_server_api_key has a control character at position {i + 1}: it cannot be sent in an "
                "HTTP Authorization header"
            )
    if text != text.rstrip():
        return "sglang_server_api_key ends with whitespace, which HTTP strips from the Authorization header"
    if text.startswith("-"):
        return "sglang_server_api_key starts with '-': SGLang's argparse may take it for an option (--api-key -...)"
    return ""


def sglang_model_is_local(model) -> bool:
    """A model given as an absolute path is a local directory (HF_HUB_OFFLINE=1); anything else a hub id."""
    return str(model or "").startswith("/")


def sglang_regex_problems(patterns, variable) -> list[str]:
    """Messages for the regexes in ``patterns`` that Python's ``re`` (what the smoke module uses) cannot compile.

    ``patterns`` is a list of regex strings or of mappings whose ``expect`` is one (smoke prompts); ``variable``
    names the variable in the message, with the index of the bad entry.
    """
    if patterns is None:
        return []
    if not isinstance(patterns, (list, tuple)):
        return [f"{variable} must be a list, got {type(patterns).__name__}"]
    problems = []
    for i, item in enumerate(patterns):
        where = f"{variable}[{i}]"
        pattern = item
        if isinstance(item, dict):
            if "prompt" not in item or not str(item.get("prompt") or "").strip():
                problems.append(f"{where} has no prompt: each entry is {{prompt, expect, max_tokens}}")
            max_tokens = item.get("max_tokens", 1)
            if isinstance(max_tokens, bool) or not str(max_tokens).isdigit() or int(str(max_tokens)) < 1:
                problems.append(f"{where}.max_tokens={max_tokens!r} must be a positive integer")
            pattern = item.get("expect", "")
            where += ".expect"
        if pattern is None or isinstance(pattern, (dict, list, bool)):
            problems.append(f"{where} must be a regex string, got {type(pattern).__name__}")
            continue
        try:
            re.compile(str(pattern))
        except re.error as exc:
            problems.append(f"{where}={str(pattern)!r} is not a valid Python regex ({exc}): fix or escape it")
    return problems


def sglang_table_options(_unused=None, table_path=None) -> list[str]:
    """Every option string of the pinned argument table (what preflight checks flags against before the engine
    is installed; the server stage checks the installed engine's --help again)."""
    return sorted(load_table(table_path))


def sglang_table_version(_unused=None, table_path=None) -> str:
    """The SGLang version of the pinned argument table (e.g. 0.5.9)."""
    return table_version(table_path)


def sglang_is_loopback(host) -> bool:
    """The server's --host only accepts local connections (127.0.0.0/8, ::1, localhost)."""
    text = str(host or "").strip().strip("[]").lower()
    return text == "localhost" or text == "::1" or re.fullmatch(r"127(\.[0-9]{1,3}){3}", text) is not None


def sglang_port_holder_problems(probe, port) -> list[str]:
    """The refusal of a server port that another program listens on, from sglang_server_probe's result
    (``port_foreign``: listeners outside the unit, with their PIDs and units); empty when the port is free or
    the unit's own."""
    foreign = list((probe or {}).get("port_foreign") or [])
    if not foreign:
        return []
    local = ", ".join(str(f.get("local", "")) for f in foreign)
    pids = ", ".join(str(p) for f in foreign for p in f.get("pids") or []) or "unknown"
    units = ", ".join(str(u) for f in foreign for u in f.get("units") or []) or "none"
    return [
        f"port {port} is taken by another program ({local}, PIDs {pids}, units {units}): free it or choose another "
        "port (sglang_server_args_*: port)"
    ]


class FilterModule:
    def filters(self):
        return {
            "sglang_argv": _wrap(sglang_argv),
            "sglang_rendered_options": _wrap(sglang_rendered_options),
            "sglang_help_options": _wrap(sglang_help_options),
            "sglang_flag_problems": _wrap(sglang_flag_problems),
            "sglang_resolved_policy_problems": _wrap(sglang_resolved_policy_problems),
            "sglang_arg": _wrap(sglang_arg),
            "sglang_gpu_indices": _wrap(sglang_gpu_indices),
            "sglang_merge_flags": _wrap(sglang_merge_flags),
            "sglang_flag_layer": _wrap(sglang_flag_layer),
            "sglang_parallel": _wrap(sglang_parallel),
            "systemd_exec_args": _wrap(systemd_exec_args),
            "systemd_environment": _wrap(systemd_environment),
            "env_file_line": _wrap(env_file_line),
            "sglang_api_key_problem": _wrap(sglang_api_key_problem),
            "sglang_api_key_config_writer": _wrap(sglang_api_key_config_writer),
            "sglang_model_is_local": _wrap(sglang_model_is_local),
            "sglang_regex_problems": _wrap(sglang_regex_problems),
            "sglang_is_loopback": _wrap(sglang_is_loopback),
            "sglang_port_holder_problems": _wrap(sglang_port_holder_problems),
            "sglang_table_options": _wrap(sglang_table_options),
            "sglang_table_version": _wrap(sglang_table_version),
            "sglang_journal_match": journal_match,
        }


def _wrap(func):
    return as_filter_error(func, SglangArgsError, "sglang_server")
