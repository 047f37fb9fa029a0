import hashlib
import os
import os.path as osp

import pytest

from pyg_grf.datasets import (
    DatasetNotFoundError,
    data_root,
    fetch_from_mirror,
    load_planetoid,
    load_tu,
    mirror_root,
)
from pyg_grf.datasets.mirror import MirrorIntegrityError, check_not_in_mirror, write_checksums
from tests.datasets.conftest import listing, toy_mirror


@pytest.fixture
def fake_mirror(tmp_path, monkeypatch):
    mirror = tmp_path / 'mirror'
    raw = mirror / 'TUDataset' / 'TOY' / 'raw'
    raw.mkdir(parents=True)
    (raw / 'TOY_A.txt').write_text('1, 2\n2, 1\n')
    (raw / 'TOY_graph_indicator.txt').write_text('1\n1\n')
    (mirror / 'TUDataset' / 'TOY' / 'processed').mkdir()
    (mirror / 'TUDataset' / 'TOY' / 'processed' / 'junk.pt').write_text('x')
    (mirror / 'TUDataset' / 'TOY' / 'processed_0123abcd').mkdir()
    (mirror / 'TUDataset' / 'TOY' / 'processed_0123abcd' / 'pre_transform.pt').write_text('x')
    write_checksums(str(mirror))
    monkeypatch.setenv('PYG_GRF_MIRROR', str(mirror))
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'data'))
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')
    return mirror


def test_roots(monkeypatch, tmp_path):
    monkeypatch.delenv('PYG_GRF_DATA', raising=False)
    monkeypatch.delenv('PYG_GRF_MIRROR', raising=False)
    assert data_root() == osp.abspath('datasets')
    assert mirror_root() is None
    assert fetch_from_mirror('TUDataset/MUTAG', str(tmp_path / 'x')) is None
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'd'))
    assert data_root() == str(tmp_path / 'd')


def test_fetch_copies_and_skips(fake_mirror, tmp_path):
    before = listing(fake_mirror)
    dest = tmp_path / 'data' / 'TUDataset' / 'TOY'
    copied = fetch_from_mirror('TUDataset/TOY')  # default destination: the data root
    assert sorted(osp.relpath(p, dest) for p in copied) == [
        osp.join('raw', 'TOY_A.txt'), osp.join('raw', 'TOY_graph_indicator.txt')]
    assert not (dest / 'processed').exists()  # the mirror's processed/ is never copied
    assert not (dest / 'processed_0123abcd').exists()  # nor any processed_<hash>/
    assert (dest / 'raw' / 'TOY_A.txt').read_text() == '1, 2\n2, 1\n'

    # Files already present are kept, not overwritten.
    (dest / 'raw' / 'TOY_A.txt').write_text('mine')
    assert fetch_from_mirror('TUDataset/TOY', str(dest)) == []
    assert (dest / 'raw' / 'TOY_A.txt').read_text() == 'mine'
    assert fetch_from_mirror('TUDataset/NOPE', str(dest)) is None
    assert listing(fake_mirror) == before
    assert not any(name.endswith('.part') for _, _, names in os.walk(dest) for name in names)


def test_missing_mirror_dir(monkeypatch, tmp_path):
    monkeypatch.setenv('PYG_GRF_MIRROR', str(tmp_path / 'does-not-exist'))
    with pytest.raises(DatasetNotFoundError, match='PYG_GRF_MIRROR.*not a directory'):
        mirror_root()
    with pytest.raises(DatasetNotFoundError, match='not a directory'):
        load_tu('MUTAG', root=str(tmp_path / 'tu'))


def test_offline_not_found(monkeypatch, tmp_path):
    monkeypatch.setenv('PYG_GRF_OFFLINE', '1')
    monkeypatch.delenv('PYG_GRF_MIRROR', raising=False)
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'data'))
    with pytest.raises(DatasetNotFoundError, match=r"MUTAG.*PYG_GRF_MIRROR is not set.*Set "
                                                   r"\$PYG_GRF_MIRROR"):
        load_tu('MUTAG')
    with pytest.raises(DatasetNotFoundError, match=r"Cora.*ind\.cora\.x.*PYG_GRF_MIRROR"):
        load_planetoid('Cora')
    assert not list((tmp_path / 'data').rglob('processed_*'))


def test_dataset_missing_from_mirror(fake_mirror):
    with pytest.raises(DatasetNotFoundError, match="mirror .* has no complete 'TUDataset/MUTAG'"):
        load_tu('MUTAG')
    with pytest.raises(DatasetNotFoundError, match='not one of the known TU datasets'):
        load_tu('MUTAGG')


def test_never_process_inside_mirror(fake_mirror, monkeypatch):
    monkeypatch.setenv('PYG_GRF_DATA', str(fake_mirror))
    with pytest.raises(ValueError, match='inside the read-only mirror'):
        check_not_in_mirror(osp.join(str(fake_mirror), 'TUDataset'))
    before = listing(fake_mirror)
    with pytest.raises(ValueError, match='inside the read-only mirror'):
        load_tu('TOY')  # its raw files are there, so PyG would process in place
    with pytest.raises(ValueError, match='inside the read-only mirror'):
        fetch_from_mirror('TUDataset/TOY', str(fake_mirror / 'TUDataset' / 'copy'))
    assert listing(fake_mirror) == before


def test_load_tu_from_fake_mirror(fake_mirror, tmp_path):
    before = listing(fake_mirror)
    dataset = load_tu('TOY')
    assert len(dataset) == 1
    assert dataset[0].num_nodes == 2
    # No node features: one-hot degree features with the largest degree (1) are added.
    assert dataset[0].x.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    assert load_tu('TOY', use_degree_features=False)[0].x is None
    toy = tmp_path / 'data' / 'TUDataset' / 'TOY'
    assert len(list(toy.glob('processed_*/MANIFEST.json'))) == 1
    assert listing(fake_mirror) == before


def test_pinned_hashes_beat_a_regenerated_checksum_file(tmp_path, monkeypatch):
    # SHA256SUMS lives in the mirror it checks; a tampered Planetoid pickle
    # with a regenerated SHA256SUMS is refused by the hash pinned in the package
    from pyg_grf.datasets.mirror import MirrorIntegrityError, fetch_from_mirror
    from pyg_grf.datasets.pinned import PINNED_SHA256
    mirror = tmp_path / 'mirror'
    raw = mirror / 'Planetoid' / 'Cora' / 'raw'
    raw.mkdir(parents=True)
    (raw / 'ind.cora.x').write_bytes(b'not the real file')  # pinned name, wrong content
    write_checksums(str(mirror))  # the attacker regenerates the mirror's checksums
    monkeypatch.setenv('PYG_GRF_MIRROR', str(mirror))
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'data'))
    assert 'Planetoid/Cora/raw/ind.cora.x' in PINNED_SHA256
    with pytest.raises(MirrorIntegrityError, match="pins .* the mirror was modified"):
        fetch_from_mirror('Planetoid/Cora')
    assert not (tmp_path / 'data' / 'Planetoid' / 'Cora' / 'raw' / 'ind.cora.x').exists()
    # an unpickled file without a pinned hash is refused even when SHA256SUMS lists it
    other = mirror / 'Planetoid' / 'Mine' / 'raw'
    other.mkdir(parents=True)
    (other / 'ind.mine.x').write_bytes(b'pickle')
    write_checksums(str(mirror))
    with pytest.raises(MirrorIntegrityError, match="unpickled by its loader.*pins no SHA-256"):
        fetch_from_mirror('Planetoid/Mine')


@pytest.mark.data
def test_pinned_hashes_match_the_project_mirror(mirror):
    # every pinned file is in the mirror with that hash (and the mirror's own list agrees)
    from pyg_grf.datasets.mirror import file_digest, read_checksums
    from pyg_grf.datasets.pinned import PINNED_SHA256
    sums = read_checksums(str(mirror))
    for key, sha in PINNED_SHA256.items():
        assert sums[key] == sha
        assert file_digest(str(mirror / key)) == sha


def test_failed_download_says_how_to_load_offline(tmp_path, monkeypatch):
    # online, nothing in the mirror: download() falls back to PyG's download; when that fails the
    # error says how to load offline; a failure with every raw file present propagates unchanged
    from pyg_grf.datasets import TUDataset
    (tmp_path / 'empty_mirror').mkdir()
    write_checksums(str(tmp_path / 'empty_mirror'))
    monkeypatch.setenv('PYG_GRF_MIRROR', str(tmp_path / 'empty_mirror'))
    monkeypatch.setenv('PYG_GRF_DATA', str(tmp_path / 'data'))
    monkeypatch.delenv('PYG_GRF_OFFLINE', raising=False)
    calls = []

    def no_network(self):
        calls.append(self.name)
        raise OSError('network unreachable')
    monkeypatch.setattr(TUDataset, 'download_from_source', no_network)
    with pytest.raises(DatasetNotFoundError, match=r"TOY.*not found.*TOY_A\.txt.*The download "
                                                   r"failed: OSError: network unreachable"):
        load_tu('TOY')
    assert calls == ['TOY']
    raw = tmp_path / 'data' / 'TUDataset' / 'TOY' / 'raw'
    (raw / 'TOY_A.txt').write_text('corrupt')
    (raw / 'TOY_graph_indicator.txt').write_text('1\n')
    with pytest.raises(Exception) as info:
        load_tu('TOY')
    assert not isinstance(info.value, DatasetNotFoundError) and calls == ['TOY']


def test_mirror_never_copies_processed_caches(tmp_path, monkeypatch):
    mirror = toy_mirror(tmp_path, monkeypatch, checksums=False)
    evil = mirror / 'TUDataset' / 'TOY' / 'processed_0123456789abcdef'
    evil.mkdir()
    (evil / 'pre_transform.pt').write_bytes(b'pickle that runs code')
    write_checksums(str(mirror))
    # Even when the mirror's SHA256SUMS lists it, a processed* folder is not copied.
    with open(mirror / 'SHA256SUMS', 'a') as f:
        f.write(f"{hashlib.sha256(b'pickle that runs code').hexdigest()}  "
                f"TUDataset/TOY/processed_0123456789abcdef/pre_transform.pt\n")
    dest = tmp_path / 'data' / 'TUDataset' / 'TOY'
    copied = fetch_from_mirror('TUDataset/TOY')
    assert len(copied) == 3
    assert not any(p.name.startswith('processed') for p in dest.iterdir())


def test_tampered_mirror_file_is_refused(tmp_path, monkeypatch):
    mirror = toy_mirror(tmp_path, monkeypatch)
    (mirror / 'TUDataset' / 'TOY' / 'raw' / 'TOY_A.txt').write_text('1, 2\n2, 1\n3, 4\n')
    with pytest.raises(MirrorIntegrityError, match=r"'TUDataset/TOY/raw/TOY_A\.txt' .* has "
                                                   r"SHA-256 .* but SHA256SUMS lists"):
        load_tu('TOY')
    assert not (tmp_path / 'data' / 'TUDataset' / 'TOY' / 'raw' / 'TOY_A.txt').exists()


def test_unlisted_mirror_file_and_changed_symlink_are_refused(tmp_path, monkeypatch):
    mirror = toy_mirror(tmp_path, monkeypatch)
    raw = mirror / 'TUDataset' / 'TOY' / 'raw'
    (raw / 'TOY_node_labels.txt').write_text('0\n0\n1\n1\n')  # not in SHA256SUMS
    with pytest.raises(MirrorIntegrityError, match='not in its SHA256SUMS'):
        fetch_from_mirror('TUDataset/TOY')
    (raw / 'TOY_node_labels.txt').unlink()
    # A symlink whose target changed: its content is checked, not the link.
    outside = tmp_path / 'outside.txt'
    outside.write_text('1\n1\n2\n2\n')
    (raw / 'TOY_graph_indicator.txt').unlink()
    (raw / 'TOY_graph_indicator.txt').symlink_to(raw / 'TOY_graph_labels.txt')
    with pytest.raises(MirrorIntegrityError, match='TOY_graph_indicator.txt.*SHA-256'):
        fetch_from_mirror('TUDataset/TOY', str(tmp_path / 'dest1'))
    (raw / 'TOY_graph_indicator.txt').unlink()
    (raw / 'TOY_graph_indicator.txt').symlink_to(outside)
    with pytest.raises(MirrorIntegrityError, match='outside the mirror'):
        fetch_from_mirror('TUDataset/TOY', str(tmp_path / 'dest2'))


def test_mirror_without_checksums_is_refused_unless_unverified_allowed(tmp_path, monkeypatch):
    toy_mirror(tmp_path, monkeypatch, checksums=False)
    with pytest.raises(MirrorIntegrityError, match=r'has no SHA256SUMS.*write_checksums.*'
                                                   r'PYG_GRF_MIRROR_UNVERIFIED=1'):
        load_tu('TOY')
    monkeypatch.setenv('PYG_GRF_MIRROR_UNVERIFIED', '1')
    with pytest.warns(UserWarning, match='unverified'):
        assert len(load_tu('TOY')) == 2


def test_shared_mirror_ships_checksums():
    from pyg_grf.datasets.mirror import read_checksums
    from tests.conftest import mirror_path
    if not mirror_path().is_dir():
        pytest.skip('no dataset mirror')
    sums = read_checksums(str(mirror_path()))
    assert sums and 'TUDataset/MUTAG/raw/MUTAG_A.txt' in sums


def test_fetch_refuses_paths_that_leave_the_mirror(tmp_path, monkeypatch):
    toy_mirror(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="without '..'"):
        fetch_from_mirror('TUDataset/../../outside')
