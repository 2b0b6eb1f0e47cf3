"""The API key reaches SGLang unchanged: the rendered unit's ExecStartPre writes it into the --config YAML, and
the real ``yaml.safe_load`` (PyYAML, what sglang 0.5.9's ConfigArgumentMerger uses) gives it back as it was.
Also: keys 0.5.9 could never compare are refused with a reason that does not show the key, the EnvironmentFile
line keeps every character, and the log redactor masks the key in the form SGLang prints it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import collection_jinja
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "sglang_server"
sys.path.insert(0, str(REPO / "lab" / "sglang-sim" / "src"))

from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as f  # noqa: E402
from sglang_sim import cli  # noqa: E402

HOSTILE = [
    "00017",
    "yes",
    "no",
    "null",
    "~",
    "1e3",
    "0x1F",
    "a: b",
    "x #y",
    "*k",
    "&anchor",
    "!!binary",
    "- item",
    "[1, 2]",
    "{a: 1}",
    "it's",
    "''",
    'say "hi"',
    "mixed 'single' and \"double\"",
    "back\\slash\\",
    "\\n not a newline",
    "$HOME ${X} `id` $(id)",
    "100% %n %%",
    "  leading spaces",
    "tab\tinside",
    "ünïcödé",
    "ключ-секрет",
    "鍵🔑🚀",
    "%",
    "a" * 300,
]


def render_unit(**overrides) -> str:
    env = collection_jinja.environment()
    variables = {
        "sglang_server_api_key": "set",
        "sglang_server_argv": ["--model-path", "/srv/models/glm-5", "--port", "8000"],
        "sglang_server_cache_dir": "/var/cache/sglang-server",
        "sglang_server_group": "sglang",
        "sglang_server_module": "sglang.launch_server",
        "sglang_server_python": "/opt/ml-env/releases/r1/bin/python",
        "sglang_server_read_write_paths": [],
        "sglang_server_redactor_path": "/usr/local/libexec/gpufleet/sglang-log-redact",
        "sglang_server_redactor_sha256": "0" * 64,
        "sglang_server_release_id": "r1",
        "sglang_server_restart_policy": "on-failure",
        "sglang_server_restart_sec": 5,
        "sglang_server_runtime_dir_name": "sglang-server",
        "sglang_server_secrets_file": "/etc/sglang-server/secrets.env",
        "sglang_server_served_name": "glm-5",
        "sglang_server_start_limit_burst": 3,
        "sglang_server_start_limit_interval_s": 600,
        "sglang_server_supplementary_groups": [],
        "sglang_server_timeout_start_s": 1800,
        "sglang_server_timeout_stop_s": 300,
        "sglang_server_unit_environment": {},
        "sglang_server_use_redactor": True,
        "sglang_server_user": "sglang",
        "sglang_server_user_home": "/var/lib/sglang",
    }
    variables.update(overrides)
    return env.from_string((ROLE / "templates" / "sglang-server.service.j2").read_text()).render(variables)


def systemd_words(value: str) -> list[str]:
    """An Exec line's words as systemd passes them (it unescapes %% and $$; the rest is shell-like quoting)."""
    return shlex.split(value.replace("%%", "%").replace("$$", "$"))


def exec_line(unit: str, key: str) -> str:
    lines = [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith(key + "=")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def writer_argv() -> list[str]:
    return systemd_words(exec_line(render_unit(), "ExecStartPre"))


def write_config(writer_argv, key: str, path: Path) -> str:
    argv = [sys.executable, *writer_argv[1:-1], str(path)]
    assert writer_argv[0] == "/opt/ml-env/releases/r1/bin/python"
    assert writer_argv[-1] == "/run/sglang-server/secret-args.yaml"
    env = {"SGLANG_SERVER_API_KEY": key, "PATH": os.environ.get("PATH", "/usr/bin")}
    subprocess.run(argv, env=env, check=True)
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("key", HOSTILE)
def test_yaml_safe_load_gives_every_key_back_unchanged(writer_argv, tmp_path, key):
    path = tmp_path / "secret-args.yaml"
    text = write_config(writer_argv, key, path)
    assert yaml.safe_load(text) == {"api-key": key}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # and SGLang's own merge of --config (the simulator runs 0.5.9's ConfigArgumentMerger with PyYAML)
    assert cli.parse(["--model-path", "/m", "--config", str(path)]).api_key == key


def test_plain_yaml_would_change_the_keys():
    """What the unit used to write (``api-key: <key>``, unquoted) and what yaml.safe_load made of it."""
    assert yaml.safe_load("api-key: 00017") == {"api-key": 15}
    assert yaml.safe_load("api-key: yes") == {"api-key": True}
    assert yaml.safe_load("api-key: x #y") == {"api-key": "x"}
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load("api-key: *k")


def test_the_key_is_in_no_argv_and_not_in_the_unit():
    unit = render_unit(sglang_server_api_key="k3y-s3cret-value")
    assert "k3y-s3cret-value" not in unit
    pre = systemd_words(exec_line(unit, "ExecStartPre"))
    assert "SGLANG_SERVER_API_KEY" in pre[3] and "os.environ" in pre[3]  # read from the environment
    start = systemd_words(exec_line(unit, "ExecStart"))
    assert start[-2:] == ["--config", "/run/sglang-server/secret-args.yaml"]
    assert "--api-key" not in start
    assert "ExecStartPre" not in render_unit(sglang_server_api_key="")


@pytest.mark.parametrize("key", HOSTILE)
def test_environment_file_line_keeps_every_character(key):
    line = f.env_file_line("SGLANG_SERVER_API_KEY", key)
    assert "\n" not in line
    assert systemd_env_file_value(line) == key


def systemd_env_file_value(line: str) -> str:
    """A double-quoted EnvironmentFile value as systemd 252 parses it (env-file.c, DOUBLE_QUOTE_VALUE):
    a backslash before one of ``"\\`$`` gives that character, before anything else it stays."""
    m = re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*="(.*)"', line, re.S)
    assert m, line
    out, body, i = [], m.group(1), 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append(nxt if nxt in '"\\`$' else c + nxt)
            i += 2
            continue
        assert c != '"', f"unescaped quote in {line!r}"
        out.append(c)
        i += 1
    return "".join(out)


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("clé", "non-ASCII character at position 3"),
        ("鍵🔑", "non-ASCII character at position 1"),
        ("tab\there", "control character at position 4"),
        ("trailing ", "ends with whitespace"),
        ("-dash-first", "starts with '-'"),
        ("---", "starts with '-'"),
    ],
)
def test_keys_sglang_0_5_9_cannot_compare_are_refused_without_showing_them(key, words):
    problem = f.sglang_api_key_problem(key)
    assert words in problem and key not in problem
    # every refusal says what to do instead
    assert "Fix: choose another key of printable ASCII that does not start with '-'" in problem
    assert "openssl rand -hex 32" in problem and "vault_sglang_server_api_key" in problem


@pytest.mark.parametrize("key", [k for k in HOSTILE if k.isascii() and "\t" not in k and not k.startswith("-")])
def test_printable_ascii_keys_are_accepted(key):
    assert f.sglang_api_key_problem(key) == ""


def test_a_leading_dash_is_taken_for_an_option_by_sglangs_parser(tmp_path, capsys):
    path = tmp_path / "secret-args.yaml"
    path.write_text("api-key: '-dash-first'\n")
    with pytest.raises(SystemExit):
        cli.parse(["--model-path", "/m", "--config", str(path)])
    assert "--api-key: expected one argument" in capsys.readouterr().err


def _redactor():
    spec = importlib.util.spec_from_file_location("sglang_log_redact", ROLE / "files" / "sglang-log-redact.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", ["yes", "*k", "it's", "back\\slash\\", 'say "hi"', "00017", "k3y-s3cret-value"])
def test_redactor_masks_the_key_as_sglang_prints_it(key):
    red = _redactor()
    forms = red.secret_forms([key, ""])
    line = f"[2026-11-30 10:00:00] server_args=ServerArgs(model_path='/m', api_key={key!r}, port=8000)\n".encode()
    out = red.redact_forms(line, forms).decode()
    assert "api_key='[REDACTED]'" in out
    assert repr(key) not in out and (len(key) < 4 or key not in out)
