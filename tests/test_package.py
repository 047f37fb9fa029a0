r"""Checks over the product's source (package, benchmarks, experiments)."""
import os
import os.path as osp
import re

from tests.conftest import REPO


def test_every_torch_load_sets_weights_only():
    # no file read by our code can run code on load
    # the package where it is imported from (the installed wheel in CI), the scripts from the tree
    import pyg_grf
    package = osp.dirname(pyg_grf.__file__)
    tops = [package, osp.join(REPO, 'bench'), osp.join(REPO, 'experiments')]
    assert sum(1 for _, _, files in os.walk(package) for f in files if f.endswith('.py')) > 50
    offenders = []
    for top in tops:
        for dirpath, _, files in os.walk(top):
            for name in files:
                if not name.endswith('.py'):
                    continue
                path = osp.join(dirpath, name)
                text = open(path).read()
                for m in re.finditer(r'torch\.load\(', text):
                    call = text[m.start():text.find(')', m.start()) + 1]
                    if 'weights_only' not in call:
                        offenders.append(f'{path}: {call}')
    assert offenders == []
