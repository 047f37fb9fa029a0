r"""Memory estimates and the room left (:mod:`pyg_grf.memory`)."""
import pytest


def test_available_memory_respects_rlimit_as():
    import resource

    from pyg_grf.memory import available_memory
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open('/proc/self/statm') as f:
        virtual = int(f.read().split()[0]) * resource.getpagesize()
    limit = virtual + 300 * 2 ** 20
    if hard != resource.RLIM_INFINITY and limit > hard:
        pytest.skip('hard RLIMIT_AS too low to test')
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        assert available_memory() <= 300 * 2 ** 20
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
