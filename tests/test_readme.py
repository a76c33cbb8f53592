"""Every Python example in README.md runs as written."""

import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
BLOCKS = re.findall(r"```python\n(.*?)```", open(README).read(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out or index == 3  # the deployment block asserts instead of printing


def test_readme_has_the_examples_it_promises():
    assert len(BLOCKS) == 5
