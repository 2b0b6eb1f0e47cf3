"""tests/support/doc_commands.py reads the commands of the docs' marked blocks as a user types them."""

from __future__ import annotations

import doc_commands
import pytest

PAGE = """# A page

<!-- lab-commands -->
```sh
make deploy   # set up and deploy
# a comment line
curl -s http://10.0.0.1:30000/v1/models \\
  -H 'Authorization: Bearer x'

ansible-playbook playbooks/rollout.yml
```

```sh
make test
```
"""


def tree(tmp_path, page: str):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# readme\n")
    (tmp_path / "docs/lab.md").write_text(page)
    return tmp_path


def test_marked_blocks_give_each_command_as_typed(tmp_path):
    found = doc_commands.marked(tree(tmp_path, PAGE))
    assert [(c.text, c.page, c.line) for c in found] == [
        ("make deploy", "docs/lab.md", 5),
        ("curl -s http://10.0.0.1:30000/v1/models -H 'Authorization: Bearer x'", "docs/lab.md", 7),
        ("ansible-playbook playbooks/rollout.yml", "docs/lab.md", 10),
    ]  # the unmarked block's `make test` is no lab command


def test_a_command_not_in_the_docs_is_refused(tmp_path):
    root = tree(tmp_path, PAGE)
    assert doc_commands.command("make deploy", root).line == 5
    with pytest.raises(AssertionError, match="not a command of a"):
        doc_commands.command("ansible-playbook playbooks/rollout.yml -e x=1", root)


@pytest.mark.parametrize(
    ("page", "why"),
    [("<!-- lab-commands -->\ntext\n```sh\nmake deploy\n```\n", "must stand right above"),
     ("<!-- lab-commands -->\n```sh\nmake deploy\n", "never ends")],
)  # fmt: skip
def test_a_broken_mark_is_an_error(tmp_path, page, why):
    with pytest.raises(ValueError, match=why):
        doc_commands.marked(tree(tmp_path, page))


def test_the_docs_mark_the_readme_commands_and_the_lab_day_two_commands():
    texts = [c.text for c in doc_commands.marked()]
    assert texts[0] == "make deploy" and texts[1].startswith("curl -s http://10.123.0.4:30000/v1/chat/completions")
    assert "ansible-playbook playbooks/rollout.yml" in texts and "ansible-playbook playbooks/bench.yml" in texts


def test_the_users_shell_has_the_venv_and_none_of_makes_variables(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/lab")
    monkeypatch.setenv("ANSIBLE_CONFIG", "/elsewhere/ansible.cfg")
    env = doc_commands.user_env()
    assert "PYTHONPATH" not in env and "ANSIBLE_CONFIG" not in env
    assert env["PATH"].startswith(f"{doc_commands.ROOT}/.venv/bin:")
