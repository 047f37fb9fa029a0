r"""Checks over the product's source (package, benchmarks, experiments)."""
import os
import os.path as osp
import re

from tests.conftest import REPO


def test_every_torch_load_sets_weights_only():
    # no file read by our code can run code on load
    offenders = []
    for top in ('pyg_grf', 'bench', 'experiments'):
        for dirpath, _, files in os.walk(osp.join(REPO, top)):
            for name in files:
                if not name.endswith('.py'):
                    continue
                path = osp.join(dirpath, name)
                text = open(path).read()
                for m in re.finditer(r'torch\.load\(', text):
                    call = text[m.start():text.find(')', m.start()) + 1]
                    if 'weights_only' not in call:
                        offenders.append(f'{osp.relpath(path, REPO)}: {call}')
    assert offenders == []
