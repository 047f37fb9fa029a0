"""README.md is a front page that runs: its python blocks are executed, its test commands are the
ones CI runs, and it stays one screenful (at most 200 lines)."""
import re

import pytest
import torch

from tests.conftest import REPO


def readme():
    return (REPO / 'README.md').read_text()


def python_blocks():
    return re.findall(r'```python\n(.*?)```', readme(), re.S)


def run_block(index, name):
    scope = {}
    exec(compile(python_blocks()[index], f'README.md {name}', 'exec'), scope)
    return scope


def test_readme_is_a_front_page():
    assert len(readme().splitlines()) <= 200
    assert len(python_blocks()) == 2  # every block is run by a test below


def test_readme_test_commands_are_what_ci_runs():
    section = readme().split('## Tests', 1)[1]
    commands = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
    pytest_calls = [re.search(r'python -m pytest.*?(?=\s+#|$)', line).group(0)
                    for line in commands.splitlines() if 'python -m pytest' in line]
    assert pytest_calls == ['python -m pytest -n auto',
                            'python -m pytest -n auto -m "slow or data"']
    ci = (REPO / '.ci' / 'run').read_text().splitlines()
    for call in pytest_calls:
        assert call in ci, f'.ci/run does not run the README command {call!r}'
    install = re.search(r'pip install "torch==([^"]+)" -e "\.\[([^\]]+)\]"', readme())
    assert install is not None
    assert f'"torch=={install.group(1)}" "$WHEEL[{install.group(2)}]"' in '\n'.join(ci)


def test_readme_quick_start_runs():
    scope = run_block(0, 'quick start')
    out, attn = scope['out'], scope['attn']
    assert out.shape == (scope['batch'].num_nodes, 32)
    assert attn.f.grad is not None and bool(attn.f.grad.abs().sum() > 0)


@pytest.mark.data
def test_readme_own_model_trains_on_mutag(mirror):
    torch.manual_seed(0)
    scope = run_block(1, 'own model')
    # MUTAG's majority class is 125 / 188 = 0.665: the model learned something beyond it
    assert scope['acc'] > 0.69


def test_docs_index_public_api_imports():
    text = (REPO / 'docs' / 'index.md').read_text()
    code = re.search(r'## Public API.*?```python\n(.*?)```', text, re.S).group(1)
    exec(compile(code, 'docs/index.md public API', 'exec'), {})
