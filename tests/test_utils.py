import ctypes
import sys

import pytest

from pyg_grf.utils import ENV, tune_malloc


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc mallopt')
def test_tune_malloc_applies_on_glibc(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    try:
        ctypes.CDLL('libc.so.6').mallopt
    except (OSError, AttributeError):
        pytest.skip('no glibc')
    assert tune_malloc() is True


def test_tune_malloc_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(ENV, 'default')
    assert tune_malloc() is False
