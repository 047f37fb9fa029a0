r"""Tests of the experiments' own code (``experiments/*.py``), which is not part of the package.

:func:`experiment_module` imports ``experiments/<name>.py`` the way the experiment scripts and
the ``PYTHONPATH=experiments`` configs name it: as the top-level module ``<name>``."""
import importlib
import sys

from tests.conftest import REPO

EXPERIMENTS = REPO / 'experiments'


def experiment_module(name: str):
    r"""``experiments/<name>.py`` as the module ``<name>`` (the experiments folder joins
    ``sys.path``, as the experiment scripts put it there themselves)."""
    if str(EXPERIMENTS) not in sys.path:
        sys.path.insert(0, str(EXPERIMENTS))
    module = importlib.import_module(name)
    assert module.__file__ == str(EXPERIMENTS / f'{name}.py'), \
        f'expected {name} from {EXPERIMENTS}, got {module.__file__}'
    return module
