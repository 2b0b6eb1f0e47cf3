"""SGLang server flags from one engine version to another (engine lanes: docs/engine-lanes.md).

Two parts, both data-driven:

* ``RULES``: the options SGLang renamed, folded into another option's value, retired or deprecated between the
  versions that have an argument table (module_utils/sglang_args/sglang-args-<version>.json). The candidates came
  from diffing the tables (lab/real-engine/reduce_table.py over each version's own parser); each rule is mapped by
  hand and cites sglang's source of both sides (the installed wheels' files, line numbers as of those wheels).
* ``migrate_flags``: applies the rules that lie between two versions (forward or backward), then checks every flag
  left against the target version's table (option present, not retired, value among its choices). A flag that no
  rule maps and the target does not take is reported in ``unmapped`` by name: the caller refuses it.

A lock (``locks/<name>/``) is an engine lane: ``engine_lane`` reads the sglang version it pins (requirements.txt,
else requirements.in: the one place a lane's engine version comes from) and its CUDA version (lock.yml).
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.sglang_args_table import (
    DEFAULT_VERSION,
    load_table,
    table_file,
    table_versions,
    version_order,
)

_OMITTED = (None, False)

# Each rule: the option (its old spelling), ``since`` (the first version with a table where the old spelling no
# longer does what it did: renamed away, retired or deprecated), what it becomes, why, and the source lines.
#   rename: the option is spelled ``to``; the value is kept (and mapped through ``values`` when given).
#   values: the option stays; listed values are respelled (``{old: new}``).
#   switch_to: a switch (true) becomes the options and values of ``to``; backwards, those options with exactly those
#              values become the switch again.
#   drop: the switch has no effect from ``since`` on (the behaviour it asked for is the default): it is removed.
#   dp_attention: ``--enable-dp-attention`` with ``--dp-size N`` becomes ``--attn-dp-size N`` (``--dp-size`` dropped).
RULES: list[dict] = [
    {
        "option": "--stream-output",
        "since": "0.5.10.post1",
        "kind": "rename",
        "to": "--incremental-streaming-output",
        "why": "renamed: --stream-output is a deprecated alias of --incremental-streaming-output from 0.5.10 on",
        "source": "0.5.9 sglang/srt/server_args.py:3348 (--stream-output); 0.5.10.post1 server_args.py:4150 "
        "(DeprecatedStoreTrueAction, new_flag='--incremental-streaming-output'); 0.5.23 has only "
        "--incremental-streaming-output",
    },
    {
        "option": "--hierarchical-sparse-attention-extra-config",
        "since": "0.5.10.post1",
        "kind": "rename",
        "to": "--hisparse-config",
        "why": "renamed to --hisparse-config (0.5.10 has only the new name; 0.5.23 keeps the old one as an alias)",
        "source": "0.5.9 sglang/srt/server_args.py:4329; 0.5.10.post1 parser (server-args-0.5.10.post1.json: "
        "--hisparse-config, dest hisparse_config); "
        "0.5.23 sglang/srt/arg_groups/fields/memory.py:245-249 "
        "(aliases=['--hierarchical-sparse-attention-extra-config'])",
    },
    {
        "option": "--enable-piecewise-cuda-graph",
        "since": "0.5.10.post1",
        "kind": "drop",
        "why": "piecewise CUDA graph is on by default from 0.5.10 (the switch became a no-op, then was retired in "
        "0.5.23)",
        "source": "0.5.9 sglang/srt/server_args.py:4606 (a switch); 0.5.10.post1 server_args.py:5479-5481 "
        "(DeprecatedAction: 'Piecewise cuda graph is enabled by default')",
    },
    {
        "option": "--nsa-prefill-backend",
        "since": "0.5.23",
        "kind": "rename",
        "to": "--dsa-prefill-backend",
        "why": "NSA is called DSA (DeepSeek Sparse Attention) in 0.5.23: --nsa-prefill-backend is gone, "
        "--dsa-prefill-backend takes the same backends (and more)",
        "source": "0.5.9 sglang/srt/server_args.py:3872; 0.5.10.post1 server_args.py:4709-4712 "
        "(--nsa-prefill-backend, NSA_CHOICES); "
        "0.5.23 sglang/srt/arg_groups/fields/exec_.py:299 (dsa_prefill_backend)",
    },
    {
        "option": "--nsa-decode-backend",
        "since": "0.5.23",
        "kind": "rename",
        "to": "--dsa-decode-backend",
        "why": "NSA is called DSA in 0.5.23: --nsa-decode-backend is gone, --dsa-decode-backend takes the same "
        "backends",
        "source": "0.5.9 sglang/srt/server_args.py:3879; 0.5.10.post1 server_args.py:4716-4719 "
        "(--nsa-decode-backend, NSA_CHOICES); "
        "0.5.23 sglang/srt/arg_groups/fields/exec_.py:341 (dsa_decode_backend)",
    },
    {
        "option": "--attention-backend",
        "since": "0.5.23",
        "kind": "values",
        "values": {"nsa": "dsa"},
        "why": "attention backend nsa is a deprecated alias of dsa in 0.5.23",
        "source": "0.5.9 sglang/srt/server_args.py:127 ('nsa'; no 'dsa' before 0.5.23); "
        "0.5.23 sglang/srt/arg_groups/choices.py:74-75 ('nsa',  # Deprecated alias for \"dsa\")",
    },
    {
        "option": "--prefill-attention-backend",
        "since": "0.5.23",
        "kind": "values",
        "values": {"nsa": "dsa"},
        "why": "attention backend nsa is a deprecated alias of dsa in 0.5.23",
        "source": "0.5.23 sglang/srt/arg_groups/choices.py:74-75",
    },
    {
        "option": "--decode-attention-backend",
        "since": "0.5.23",
        "kind": "values",
        "values": {"nsa": "dsa"},
        "why": "attention backend nsa is a deprecated alias of dsa in 0.5.23",
        "source": "0.5.23 sglang/srt/arg_groups/choices.py:74-75",
    },
    {
        "option": "--enable-flashinfer-allreduce-fusion",
        "since": "0.5.23",
        "kind": "switch_to",
        "to": {"--flashinfer-allreduce-fusion-backend": "auto"},
        "why": "deprecated in 0.5.23: FlashInfer all-reduce fusion is chosen by --flashinfer-allreduce-fusion-backend "
        "(the old switch resolves to backend auto)",
        "source": "0.5.9 sglang/srt/server_args.py:4107 (a switch); 0.5.23 server_args.py:437-443 "
        "(help '(Deprecated: use --flashinfer-allreduce-fusion-backend=auto)'); "
        "sglang/srt/arg_groups/serving_hook.py:284-296",
    },
    {
        "option": "--disable-cuda-graph",
        "since": "0.5.23",
        "kind": "switch_to",
        "to": {"--cuda-graph-backend-decode": "disabled", "--cuda-graph-backend-prefill": "disabled"},
        "why": "deprecated in 0.5.23: CUDA graphs are chosen per phase (--cuda-graph-backend-{decode,prefill})",
        "source": "0.5.9 sglang/srt/server_args.py:4490; 0.5.23 server_args.py:408-415 (DeprecatedStoreTrueAction, "
        "new_flag='--cuda-graph-backend-{decode,prefill}=disabled'); sglang/srt/arg_groups/fields/exec_.py:613-627",
    },
    {
        "option": "--disable-piecewise-cuda-graph",
        "since": "0.5.23",
        "kind": "rename",
        "to": "--disable-prefill-cuda-graph",
        "why": "the piecewise CUDA graph (extend/prefill) is the prefill-phase CUDA graph of 0.5.23",
        "source": "0.5.10.post1 sglang/srt/server_args.py:5474-5476 ('Disable piecewise cuda graph for "
        "extend/prefill'); 0.5.23 sglang/srt/arg_groups/fields/exec_.py:662-665 (disable_prefill_cuda_graph)",
    },
    {
        "option": "--cuda-graph-max-bs",
        "since": "0.5.23",
        "kind": "rename",
        "to": "--cuda-graph-max-bs-decode",
        "why": "CUDA graph batch sizes are per phase in 0.5.23; --cuda-graph-max-bs sized the decode graphs",
        "source": "0.5.9 sglang/srt/server_args.py:4478; 0.5.10.post1 server_args.py:5341; "
        "0.5.23 sglang/srt/arg_groups/fields/exec_.py:629-631",
    },
    {
        "option": "--cuda-graph-bs",
        "since": "0.5.23",
        "kind": "rename",
        "to": "--cuda-graph-bs-decode",
        "why": "CUDA graph batch sizes are per phase in 0.5.23; --cuda-graph-bs listed the decode graphs' sizes",
        "source": "0.5.9 sglang/srt/server_args.py:4484; 0.5.10.post1 server_args.py:5347; "
        "0.5.23 sglang/srt/arg_groups/fields/exec_.py:640-643",
    },
    {
        "option": "--reasoning-parser",
        "since": "0.5.10.post1",
        "kind": "values",
        "values": {"nano_v3": "nemotron_3"},
        "why": "reasoning parser nano_v3 is called nemotron_3 from 0.5.10 on (the same <think>...</think> detector)",
        "source": "0.5.9 sglang/srt/parser/reasoning_parser.py:340-362,388 (NanoV3Detector); 0.5.10.post1 "
        "reasoning_parser.py:421-445,506 (Nemotron3Detector)",
    },
    {
        "option": "--mamba-scheduler-strategy",
        "since": "0.5.23",
        "kind": "rename",
        "to": "--mamba-radix-cache-strategy",
        "why": "renamed: the mamba radix cache's strategy (same help, same choices and one more) is "
        "--mamba-radix-cache-strategy in 0.5.23",
        "source": "0.5.10.post1 sglang/srt/server_args.py:5071-5075; "
        "0.5.23 sglang/srt/arg_groups/fields/exec_.py:512-519",
    },
    {
        "option": "--enable-prefill-context-parallel",
        "since": "0.5.23",
        "kind": "rename",
        "to": "--enable-prefill-cp",
        "why": "renamed: context parallelism of the prefill phase is --enable-prefill-cp in 0.5.23 (its layout: "
        "--cp-strategy)",
        "source": "0.5.10.post1 sglang/srt/server_args.py:5663-5666; "
        "0.5.23 sglang/srt/arg_groups/fields/parallel.py:153-156",
    },
    {
        "option": "--enable-dp-attention",
        "since": "0.5.23",
        "kind": "dp_attention",
        "to": "--attn-dp-size",
        "why": "deprecated in 0.5.23: '--dp-size N --enable-dp-attention' is '--attn-dp-size N' (--dp-size counts "
        "replicas again)",
        "source": "0.5.9 sglang/srt/server_args.py:4570 (a switch); 0.5.23 server_args.py:416-424 "
        "(DeprecatedStoreTrueAction); "
        "sglang/srt/arg_groups/parallel_hook.py:39-61 (handle_deprecated_dp_attention)",
    },
]


# Options gone from a version's parser with no replacement that sglang's source names one-to-one: a flag with one of
# these is reported unmapped with the reason (the operator decides). ``since``: the first version with a table where
# the option is absent; ``source``: where the last version with it defines it. Together with RULES this covers every
# option that disappears between two consecutive tables (tests/unit/sglang_server/test_flag_migration.py).

# A gone option's source, by the first version whose parser lacks it (the line is in the version before's).
_GONE_FROM = {
    "0.5.10.post1": "absent from 0.5.10.post1's parser (server-args-0.5.10.post1.json); "
    "0.5.9 sglang/srt/server_args.py:",
    "0.5.23": "absent from 0.5.23's parser (server-args-0.5.23.json); 0.5.10.post1 sglang/srt/server_args.py:",
}
_NO_REPLACEMENT = "removed; sglang's source names no replacement"
_PIECEWISE = (
    "the piecewise CUDA graph is the prefill-phase CUDA graph in 0.5.23 (--cuda-graph-backend-prefill, "
    "--cuda-graph-bs-prefill, --cuda-graph-max-seq-len-prefill: fields/exec_.py:613-660), sized by batch and sequence "
    "length, not by tokens: no one-to-one value"
)
_PREFILL_CP = (
    "prefill context parallelism is --enable-prefill-cp with --cp-strategy zigzag|interleave in 0.5.23 "
    "(fields/parallel.py:153-163); the old split modes have no one-to-one value"
)
_NGRAM_TRIE = "ngram speculative decoding is trie-based from 0.5.10: no one-to-one value"
_DOUBLE_SPARSITY = "double-sparsity attention is gone"


def _gone(since: str, why: str, line: int) -> dict:
    """A RETIRED entry: absent from the parser of ``since``; ``line``: its server_args.py line in the version before."""
    return {"since": since, "why": why, "source": _GONE_FROM[since] + str(line)}


RETIRED: dict[str, dict] = {
    "--disable-hicache-numa-detect": _gone("0.5.10.post1", _NO_REPLACEMENT, 4299),
    "--disaggregation-decode-dp": _gone("0.5.10.post1", _NO_REPLACEMENT, 4868),
    "--disaggregation-decode-tp": _gone("0.5.10.post1", _NO_REPLACEMENT, 4862),
    "--disaggregation-prefill-pp": _gone("0.5.10.post1", _NO_REPLACEMENT, 4874),
    "--mm-max-concurrent-calls": _gone("0.5.10.post1", _NO_REPLACEMENT, 5003),
    "--mm-per-request-timeout": _gone("0.5.10.post1", _NO_REPLACEMENT, 5009),
    "--speculative-ngram-branch-length": _gone(
        "0.5.10.post1",
        "ngram speculative decoding is trie-based from 0.5.10 (--speculative-ngram-max-trie-depth, "
        "--speculative-ngram-*-bfs-breadth): no one-to-one value",
        4057,
    ),
    "--speculative-ngram-max-match-window-size": _gone("0.5.10.post1", _NGRAM_TRIE, 4032),
    "--speculative-ngram-min-match-window-size": _gone("0.5.10.post1", _NGRAM_TRIE, 4026),
    "--collect-tokens-histogram": _gone("0.5.23", _NO_REPLACEMENT, 4359),
    "--custom-sigquit-handler": _gone("0.5.23", _NO_REPLACEMENT, 4234),
    "--debug-tensor-dump-inject": _gone("0.5.23", _NO_REPLACEMENT, 5735),
    "--enable-double-sparsity": _gone("0.5.23", _DOUBLE_SPARSITY, 5259),
    "--ds-channel-config-path": _gone("0.5.23", _DOUBLE_SPARSITY, 5264),
    "--ds-heavy-channel-num": _gone("0.5.23", _DOUBLE_SPARSITY, 5270),
    "--ds-heavy-token-num": _gone("0.5.23", _DOUBLE_SPARSITY, 5276),
    "--ds-heavy-channel-type": _gone("0.5.23", _DOUBLE_SPARSITY, 5282),
    "--ds-sparse-decode-threshold": _gone("0.5.23", _DOUBLE_SPARSITY, 5288),
    "--enable-expert-distribution-metrics": _gone("0.5.23", _NO_REPLACEMENT, 5011),
    "--enable-nan-detection": _gone(
        "0.5.23",
        "deprecated in 0.5.10 for SGLANG_SPEC_NAN_DETECTION=1 and SGLANG_SPEC_OOB_DETECTION=1 (its help), gone in "
        "0.5.23, which has neither variable: set SGLANG_SANITIZE_NAN_LOGITS=1 in sglang_server_environment (NaN "
        "logits sanitized and one warning logged, which the quality gate reads; environ.py:1511, "
        "utils/async_probe.py:72-82) or SGLANG_ENABLE_NAN_LOGITS_CHECK=1 (a device-side assert that ends the "
        "server; environ.py:516)",
        5520,
    ),
    "--enable-nsa-prefill-context-parallel": _gone("0.5.23", _PREFILL_CP, 5650),
    "--nsa-prefill-cp-mode": _gone("0.5.23", _PREFILL_CP, 5655),
    "--prefill-cp-mode": _gone("0.5.23", _PREFILL_CP, 5668),
    "--enforce-piecewise-cuda-graph": _gone("0.5.23", _PIECEWISE, 5484),
    "--piecewise-cuda-graph-tokens": _gone("0.5.23", _PIECEWISE, 5489),
    "--piecewise-cuda-graph-compiler": _gone("0.5.23", _PIECEWISE, 5495),
    "--piecewise-cuda-graph-max-tokens": _gone("0.5.23", _PIECEWISE, 5508),
    "--hybrid-kvcache-ratio": _gone(
        "0.5.23",
        "a no-op (DeprecatedAction) already in 0.5.9 and 0.5.10, whose help names --swa-full-tokens-ratio",
        4030,
    ),
    "--prefill-round-robin-balance": _gone("0.5.23", "a no-op (DeprecatedAction) already in 0.5.9 and 0.5.10", 4545),
    "--keep-mm-feature-on-device": _gone("0.5.23", _NO_REPLACEMENT, 5606),
    "--multi-item-scoring-delimiter": _gone("0.5.23", _NO_REPLACEMENT, 5328),
    "--torchao-config": _gone("0.5.23", _NO_REPLACEMENT, 5514),
}


class MigrationError(ValueError):
    """Bad input: a version without a table, flags that are not a mapping."""


def version_key(version: str):
    """Order of engine versions (sglang_args_table.version_order): 0.5.9 < 0.5.10rc0 < 0.5.10.post1 < 0.5.23."""
    if not re.match(r"^\d+(\.\d+)*(\.?(rc|a|b|dev|post)\.?\d*)?$", str(version)):
        raise MigrationError(f"{version!r} is not an engine version (such as 0.5.9 or 0.5.10.post1)")
    return version_order(str(version))


def _need_table(version: str, what: str) -> dict:
    if not os.path.isfile(table_file(str(version))):
        raise MigrationError(
            f"{what} {version!r} has no SGLang argument table (versions with one: {', '.join(table_versions())}): "
            "dump its parser (lab/real-engine/dump_parser.py) and reduce it (lab/real-engine/reduce_table.py)"
        )
    return load_table(str(version))


def _opt(key) -> str:
    key = str(key)
    return key if key.startswith("--") else f"--{key}"


def _spell(option: str, like) -> str:
    """The option spelled as the caller's key is (inventory flags are written without the dashes)."""
    return option if str(like).startswith("--") else option[2:]


def rules_between(from_version: str, to_version: str) -> tuple[list[dict], bool]:
    """The rules whose ``since`` lies between the versions, in the order to apply them, and whether backwards."""
    low, high = sorted((from_version, to_version), key=version_key)
    backwards = version_key(from_version) > version_key(to_version)
    picked = [r for r in RULES if version_key(low) < version_key(r["since"]) <= version_key(high)]
    picked.sort(key=lambda r: version_key(r["since"]), reverse=backwards)
    return picked, backwards


def _forward(rule: dict, flags: dict, changes: list, held: list, context: dict) -> None:
    kind, old = rule["kind"], rule["option"]
    key = next((k for k in flags if _opt(k) == old), None)
    if key is None:
        return
    value = flags[key]
    note = {"why": rule["why"], "source": rule["source"]}
    if kind == "values":
        if isinstance(value, str) and value in rule["values"]:
            flags[key] = rule["values"][value]
            changes.append({"option": old, "from": {key: value}, "to": {key: flags[key]}, **note})
        return
    items = list(flags.items())
    at = [k for k, _unused in items].index(key)
    if value in _OMITTED:  # not rendered: only its spelling moves (or it goes), no change to report
        moved = {_spell(rule["to"], key): value} if kind == "rename" else {}
        flags.clear()
        flags.update(items[:at] + list(moved.items()) + items[at + 1 :])
        return
    if kind == "rename":
        new = {_spell(rule["to"], key): value}
    elif kind == "switch_to":
        new = {_spell(o, key): v for o, v in rule["to"].items()} if value is True else None
    elif kind == "drop":
        new = {} if value is True else None
    elif kind == "dp_attention":
        dp_key = next((k for k in flags if _opt(k) in ("--dp-size", "--data-parallel-size")), None)
        elsewhere = context.get("--dp-size", context.get("--data-parallel-size"))
        if dp_key is None and value is True and elsewhere not in (None, 1, "1"):
            why = (
                f"{old} is set here and --dp-size {elsewhere} in another layer: SGLang {rule['since']} reads the two "
                f"together as {rule['to']} {elsewhere}; write that in one layer by hand ({rule['source']})"
            )
            held.append({"option": old, "value": value, "why": why})
            return
        width = flags.get(dp_key, 1) if dp_key else 1
        # attention DP of width 1 is no attention DP: the switch goes, no --attn-dp-size
        wide = {_spell(rule["to"], key): width} if str(width) != "1" else {}
        new = wide if value is True else None
        if new is not None and dp_key:
            changes.append({"option": _opt(dp_key), "from": {dp_key: flags[dp_key]}, "to": {}, **note})
            items = [(k, v) for k, v in items if k != dp_key]
            at = [k for k, _unused in items].index(key)
    else:  # a rule of a kind this code does not know is a bug in RULES
        raise MigrationError(f"migration rule for {old} has an unknown kind {kind!r}")
    if new is None:  # a value this rule cannot carry (a switch given something other than true)
        return
    flags.clear()
    flags.update(items[:at] + list(new.items()) + items[at + 1 :])
    changes.append({"option": old, "from": {key: value}, "to": new, **note})


def _backward(rule: dict, flags: dict, changes: list, held: list, context: dict) -> None:  # noqa: ARG001
    kind, old = rule["kind"], rule["option"]
    note = {"why": "back to before " + rule["since"] + ": " + rule["why"], "source": rule["source"]}
    if kind == "values":
        key = next((k for k in flags if _opt(k) == old), None)
        back = {new: was for was, new in rule["values"].items()}
        if key is not None and isinstance(flags[key], str) and flags[key] in back:
            changes.append({"option": old, "from": {key: flags[key]}, "to": {key: back[flags[key]]}, **note})
            flags[key] = back[flags[key]]
        return
    if kind == "drop":  # the default behaviour before since had to be asked for: nothing to undo in the flags
        return
    items = list(flags.items())
    if kind in ("rename", "dp_attention"):
        key = next((k for k, _unused in items if _opt(k) == rule["to"]), None)
        if key is None:
            return
        value = flags[key]
        if kind == "rename":
            new = {_spell(old, key): value}
        elif value in _OMITTED or str(value) == "1":
            new = {}
        else:
            new = {_spell("--dp-size", key): value, _spell(old, key): True}
        at = [k for k, _unused in items].index(key)
        keep = items
    else:  # switch_to: every target option with exactly its value becomes the switch again
        keys = {o: next((k for k, _unused in items if _opt(k) == o), None) for o in rule["to"]}
        if any(keys[o] is None or str(flags[keys[o]]) != str(v) for o, v in rule["to"].items()):
            return
        key = next(iter(keys.values()))
        value = {k: flags[k] for k in keys.values()}
        new = {_spell(old, key): True}
        keep = [(k, v) for k, v in items if k not in keys.values() or k == key]
        at = [k for k, _unused in keep].index(key)
    flags.clear()
    flags.update(keep[:at] + list(new.items()) + keep[at + 1 :])
    changes.append({"option": rule["to"] if isinstance(rule["to"], str) else old,
                    "from": value if isinstance(value, dict) else {key: value}, "to": new, **note})  # fmt: skip


def _target_problem(key, value, table: dict, version: str) -> str:
    """Why the target version does not take this flag as it is ('' when it does)."""
    option = _opt(key)
    entry = table.get(option)
    if entry is None and option in RETIRED and version_key(RETIRED[option]["since"]) <= version_key(version):
        gone = RETIRED[option]
        return (
            f"{option} is not an option of SGLang {version} (retired in {gone['since']}: {gone['why']}; "
            f"{gone['source']}) and no migration rule maps it"
        )
    if entry is None:
        return f"{option} is not an option of SGLang {version} and no migration rule maps it"
    if entry["kind"] == "deprecated":
        return f"{option} is retired in SGLang {version} (a no-op or an error there) and no migration rule maps it"
    choices = entry.get("choices")
    if choices and value not in _OMITTED and value is not True:
        values = value if isinstance(value, (list, tuple)) else [value]
        bad = [str(v) for v in values if str(v) not in [str(c) for c in choices]]
        if bad:
            return f"{option}={','.join(bad)} is not one of its choices in SGLang {version}; no migration rule maps it"
    return ""


def _versions(from_version, to_version) -> tuple[str, str, dict, dict]:
    from_version, to_version = str(from_version), str(to_version)
    version_key(from_version), version_key(to_version)  # refuses what is no version before looking for a table
    return from_version, to_version, _need_table(from_version, "from_version"), _need_table(to_version, "to_version")


def _migrate(flags, from_version: str, to_version: str, source: dict, target: dict, context: dict) -> dict:
    if flags is None:
        flags = {}
    if not isinstance(flags, dict):
        raise MigrationError(f"the flags must be a mapping of option -> value, got {type(flags).__name__}")
    out = dict(flags)
    changes: list[dict] = []
    held: list[dict] = []
    rules, backwards = rules_between(from_version, to_version)
    for rule in rules:
        (_backward if backwards else _forward)(rule, out, changes, held, context)
    for key in [k for k, v in out.items() if v in _OMITTED and _opt(k) not in target]:
        del out[key]  # not rendered, and the target has no such option: it goes
    # the changes in the order of the flags they replace (as the inventory lists them), not of the rules
    position = {k: i for i, k in enumerate(flags)}
    changes.sort(key=lambda c: min((position.get(k, len(position)) for k in c["from"]), default=len(position)))
    unmapped = list(held)
    for key, value in out.items():
        if any(h["option"] == _opt(key) for h in held):
            continue
        problem = _target_problem(key, value, target, to_version)
        if problem and _opt(key) not in source and not any(_opt(key) in c["to"] or key in c["to"] for c in changes):
            problem += f" (nor is it an option of SGLang {from_version}: a typo?)"
        if problem:
            unmapped.append({"option": _opt(key), "value": value, "why": problem})
    return {"flags": out, "changes": changes, "unmapped": unmapped}


def migrate_flags(flags, from_version, to_version) -> dict:
    """``{flags, changes, unmapped}``: the flags for ``to_version``; each change ``{option, from, to, why, source}``;
    each flag the target does not take and no rule maps ``{option, value, why}`` (left in ``flags`` as it was)."""
    from_version, to_version, source, target = _versions(from_version, to_version)
    return _migrate(flags, from_version, to_version, source, target, {})


def migrate_layers(layers, from_version, to_version) -> dict:
    """The inventory's flag layers (``{variable: flags}``, lowest first) migrated one by one, so that each change and
    each unmapped flag names the variable to edit: ``{layers, changes, unmapped}``, every change and unmapped entry
    with its ``layer``. A rule that reads two options together (``--enable-dp-attention`` with ``--dp-size``) sees the
    other layers; when the two are in different layers the flag is unmapped, saying so."""
    from_version, to_version, source, target = _versions(from_version, to_version)
    if not isinstance(layers, dict):
        raise MigrationError(f"the layers must be a mapping of variable -> flags, got {type(layers).__name__}")
    out: dict = {"layers": {}, "changes": [], "unmapped": []}
    for name, flags in layers.items():
        context = {
            _opt(k): v for other, fl in layers.items() if other != name and isinstance(fl, dict) for k, v in fl.items()
        }
        try:
            result = _migrate(flags, from_version, to_version, source, target, context)
        except MigrationError as exc:
            raise MigrationError(f"{name}: {exc}") from exc
        out["layers"][name] = result["flags"]
        out["changes"] += [{"layer": name, **c} for c in result["changes"]]
        out["unmapped"] += [{"layer": name, **u} for u in result["unmapped"]]
    return out


# ---- lanes: a lock and the engine it pins ----

# The locks of the project (a checkout) or of the installed collection: both hold locks/ beside plugins/.
LOCKS_DIR = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "locks"))
_PIN_RE = re.compile(r"^sglang==([^\s;\\#]+)", re.MULTILINE)
_CUDA_RE = re.compile(r"^cuda_version:\s*['\"]?([0-9.]+)['\"]?\s*$", re.MULTILINE)
# lock.yml's engine_version: the engine version of a lock that pins no sglang (the lab's simulator, which emulates one)
_ENGINE_RE = re.compile(r"^engine_version:\s*['\"]?([0-9][0-9A-Za-z.+-]*)['\"]?\s*(?:#.*)?$", re.MULTILINE)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def engine_lane(lock, locks_dir=None, variable="ml_env_lock") -> dict:
    """The lane of lock ``lock`` (a folder of ``locks_dir``, by default the project's or installed collection's locks/,
    LOCKS_DIR): ``{lock, dir, engine_version, cuda_version, table,
    problem}``. ``engine_version`` is the sglang the lock pins (requirements.txt, else requirements.in), else the
    ``engine_version`` its lock.yml declares (a lock that pins no sglang but stands for one: the lab's simulator
    locks); ``table`` the version whose argument table checks the flags: the engine version, or the pinned default
    (DEFAULT_VERSION) for a lock with neither. ``problem`` (empty when none) names the variable that named the
    lock (``variable``) and the fix. Derived once per host and entry (ml_env's entry point lane sets the fact
    ml_env_lane, which the roles read)."""
    lock = "" if lock is None else str(lock)
    locks_dir = os.fspath(locks_dir or LOCKS_DIR)
    lane = {"lock": lock, "dir": os.path.join(locks_dir, lock), "engine_version": None, "cuda_version": None,
            "table": DEFAULT_VERSION, "problem": ""}  # fmt: skip
    known = sorted(d for d in os.listdir(locks_dir) if os.path.isfile(os.path.join(locks_dir, d, "lock.yml")))
    if not lock or "/" in lock or lock.startswith(".") or lock not in known:
        lane["problem"] = (
            f"{variable} {lock!r} names no lock folder under {locks_dir} (one with lock.yml): set {variable} to "
            + ("a lock folder (there: " if variable.endswith("_dir") else "one of ")
            + (", ".join(known) or "none")
            + (")" if variable.endswith("_dir") else "")
            + ", or write the lock (locks/README.md, "
            + f"`python locks/update_locks.py production --name {lock or '<name>'}`)"
        )
        return lane
    meta = _read(os.path.join(lane["dir"], "lock.yml"))
    cuda = _CUDA_RE.search(meta)
    lane["cuda_version"] = cuda.group(1) if cuda else None
    pinned = False
    for name in ("requirements.txt", "requirements.in"):
        pin = _PIN_RE.search(_read(os.path.join(lane["dir"], name)))
        if pin:
            lane["engine_version"], pinned = pin.group(1), True
            break
    if lane["engine_version"] is None:
        declared = _ENGINE_RE.search(meta)
        if declared is None:
            return lane
        lane["engine_version"] = declared.group(1)
    lane["table"] = lane["engine_version"]
    if not os.path.isfile(table_file(lane["engine_version"])):
        lane["problem"] = (
            f"{variable} {lock!r} {'pins sglang' if pinned else 'declares engine_version'} {lane['engine_version']}, "
            "which has no argument table "
            f"(plugins/module_utils/sglang_args/sglang-args-{lane['engine_version']}.json; tables: "
            f"{', '.join(table_versions())}): dump its parser with lab/real-engine/dump_parser.py and reduce it with "
            "lab/real-engine/reduce_table.py (docs/engine-lanes.md)"
        )
    return lane
