import re

from tests.conftest import REPO


def test_docs_masks_example_runs():
    # The usage example in docs/masks.md (README section) must run, backward included.
    text = (REPO / 'docs' / 'masks.md').read_text()
    code = re.search(r'```python\n(.*?)```', text, re.S).group(1)
    scope = {}
    exec(compile(code, 'docs/masks.md', 'exec'), scope)
    assert scope['out'].shape == (5, 2, 16)
    assert scope['a'].grad is not None
    assert str(scope['mask']) == 'TreeMask(num_nodes=5, num_trees=2, a=[-1.0, -0.2], b=0.0, heads=2)'
