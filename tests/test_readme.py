"""The README's quick start is itself a test: extract the first ```python block after
'## Quick start' and run it."""
import re

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
