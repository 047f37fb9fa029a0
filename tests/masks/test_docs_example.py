import re

from tests.conftest import REPO


def test_docs_masks_example_runs():
    # The usage example in docs/masks.md (README section) must run, backward included.
    text = (REPO / 'docs' / 'masks.md').read_text()
    blocks = re.findall(r'```python\n(.*?)```', text, re.S)
    assert len(blocks) == 3
    scope = {}
    exec(compile(blocks[0], 'docs/masks.md', 'exec'), scope)
    assert scope['out'].shape == (5, 2, 16)
    assert scope['a'].grad is not None
    assert str(scope['mask']) == ('TreeMask(num_nodes=5, num_trees=2, a=[-1.0, -0.2], b=0.0, '
                                  'heads=2)')

    # Second block: samples on one shared grid mask.
    exec(compile(blocks[1], 'docs/masks.md', 'exec'), scope)
    assert scope['out'].shape == (32, 64, 64)

    # Third block: the layer with a learnable mask module (same scope: batch, N).
    exec(compile(blocks[2], 'docs/masks.md', 'exec'), scope)
    assert scope['out'].shape == (5, 32)
    scope['out'].sum().backward()
    assert scope['attn'].mask_module.a.grad is not None
