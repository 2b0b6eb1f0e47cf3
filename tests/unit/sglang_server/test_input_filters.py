"""Filters behind the sglang_server preflight (tasks/validate_inputs.yml): regexes compiled as the smoke module
compiles them, loopback listeners told from public ones, the pinned argument table as the exact-flag list."""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.filter import sglang_server as f


def test_a_smoke_regex_that_does_not_compile_is_named_with_its_index():
    prompts = [
        {"prompt": "ok", "expect": "(?i)\\bparis\\b", "max_tokens": 64},
        {"prompt": "What is the capital of France?", "expect": "(unclosed", "max_tokens": 64},
    ]
    problems = f.sglang_regex_problems(prompts, "sglang_server_smoke_prompts")
    assert len(problems) == 1
    assert problems[0].startswith("sglang_server_smoke_prompts[1].expect='(unclosed' is not a valid Python regex")


def test_smoke_prompt_shape_and_plain_pattern_lists():
    problems = f.sglang_regex_problems([{"expect": "x", "max_tokens": 0}], "sglang_server_smoke_prompts")
    assert "sglang_server_smoke_prompts[0] has no prompt" in problems[0]
    assert "sglang_server_smoke_prompts[0].max_tokens=0 must be a positive integer" in problems[1]
    assert f.sglang_regex_problems(["\\bNaN\\b", "!{6,}"], "sglang_server_garbage_patterns") == []
    assert f.sglang_regex_problems(["a{2", "[z-a]"], "sglang_server_garbage_patterns")[0].startswith(
        "sglang_server_garbage_patterns[1]="
    )
    assert f.sglang_regex_problems("NaN", "sglang_server_garbage_patterns") == [
        "sglang_server_garbage_patterns must be a list, got str"
    ]


def test_loopback_listeners():
    assert all(f.sglang_is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(f.sglang_is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "", None, "127.0.0.1.example"))


def test_the_pinned_table_gives_exact_options_only():
    options = f.sglang_table_options()
    assert "--tp-size" in options and "--mem-fraction-static" in options and "--tp" not in options
    assert f.sglang_table_version() == "0.5.9"
    problems = f.sglang_flag_problems({"tp": 8, "max-running-request": 8}, options, "SGLang 0.5.9")
    assert "--tp is not an option of SGLang 0.5.9" in problems[0] and "--tp-size" in problems[0]
    assert "did you mean --max-running-requests" in problems[1]


def test_a_port_held_by_another_program_is_refused_naming_it_and_the_fix():
    """The probe's foreign listeners (sglang_server_probe's port_foreign) become one refusal that names the port,
    the listener, its PIDs and unit, and the variable to change; the unit's own listener or a free port: none."""
    probe = {"port_foreign": [{"local": "0.0.0.0:8001", "pids": [4242], "units": ["foreign-listener.service"]}]}
    assert f.sglang_port_holder_problems(probe, 8001) == [
        "port 8001 is taken by another program (0.0.0.0:8001, PIDs 4242, units foreign-listener.service): "
        "free it or choose another port (sglang_server_args_*: port)"
    ]
    unknown = f.sglang_port_holder_problems({"port_foreign": [{"local": "[::]:8001", "pids": [], "units": []}]}, 8001)
    assert unknown[0].startswith("port 8001 is taken by another program ([::]:8001, PIDs unknown, units none)")
    assert f.sglang_port_holder_problems({"port_foreign": []}, 8001) == []
    assert f.sglang_port_holder_problems(None, 8001) == []
