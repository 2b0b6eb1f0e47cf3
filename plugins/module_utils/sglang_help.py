"""The option strings of an SGLang ``--help`` text: read on the host (sglang_server_engine_help module) and on
the controller (the sglang_help_options filter), with one expression."""

from __future__ import annotations

import re

# A whole option string only: argparse wraps long help lines at hyphens, so prose such as "'--tokenizer-"
# + newline + "metrics-...'" must not yield "--tokenizer-" (or "--tokenizer") as an option (sglang 0.5.9's real --help).
HELP_OPTION_RE = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*(?<!-)(?![\w-])")


def help_options(help_text) -> list[str]:
    """Every option string printed by ``python -m <module> --help``, sorted, once each."""
    return sorted(set(HELP_OPTION_RE.findall(help_text or "")))
