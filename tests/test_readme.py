"""The README's quick start is itself a test: extract the first ```python block after
'## Quick start' and run it."""
import re

import pytest
import torch

from tests.conftest import REPO


def test_readme_quick_start_runs():
    text = (REPO / 'README.md').read_text()
    section = text.split('## Quick start', 1)[1]
    code = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    scope = {}
    exec(compile(code, 'README.md quick start', 'exec'), scope)
    out, attn = scope['out'], scope['attn']
    assert out.shape == (scope['batch'].num_nodes, 32)
    assert attn.f.grad is not None and bool(attn.f.grad.abs().sum() > 0)


@pytest.mark.data
def test_readme_own_model_trains_on_mutag(mirror):
    text = (REPO / 'README.md').read_text()
    section = text.split('## Your own PyG model', 1)[1]
    code = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    torch.manual_seed(0)
    scope = {}
    exec(compile(code, 'README.md own model', 'exec'), scope)
    # MUTAG's majority class is 125 / 188 = 0.665: the model learned something beyond it
    assert scope['acc'] > 0.69
