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


@pytest.mark.parametrize('text', ['...', '1.2.3', '.', '12QB'])
def test_a_malformed_memory_limit_is_a_clear_error(text, monkeypatch):
    from pyg_grf.memory import memory_budget
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', text)
    with pytest.raises(ValueError, match=r"\$PYG_GRF_MEMORY_LIMIT must be a size such as '64G'"):
        memory_budget()


@pytest.mark.parametrize('text,value', [('64G', 64 * 2 ** 30), ('1.5M', 1.5 * 2 ** 20),
                                        ('.5K', 512), ('100', 100), ('2 GiB', 2 * 2 ** 30)])
def test_memory_limit_sizes(text, value, monkeypatch):
    from pyg_grf.memory import memory_budget
    monkeypatch.setenv('PYG_GRF_MEMORY_LIMIT', text)
    assert memory_budget()[0] == value
