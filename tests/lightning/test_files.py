r"""How the package writes the files of a run: never through a symbolic link, only inside the
run folder (pyg_grf/lightning/files.py)."""
import os

import pytest

from pyg_grf.lightning.files import (
    RunFolderError,
    atomic_write,
    check_run_folder,
    read_text_nofollow,
    write_bytes,
)


def test_a_link_planted_at_the_destination_is_replaced_not_followed(tmp_path):
    target = tmp_path / 'elsewhere.txt'
    target.write_text('precious')
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'out.txt').symlink_to(target)
    write_bytes(str(run / 'out.txt'), 'new content')
    assert target.read_text() == 'precious'
    assert not (run / 'out.txt').is_symlink() and (run / 'out.txt').read_text() == 'new content'
    assert sorted(os.listdir(run)) == ['out.txt']  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / 'rows.jsonl'
    path.write_text('old\n')
    with pytest.raises(RuntimeError, match='killed'):
        with atomic_write(str(path)) as f:
            f.write('half')
            raise RuntimeError('killed')
    assert path.read_text() == 'old\n' and os.listdir(tmp_path) == ['rows.jsonl']
    with pytest.raises(ValueError, match="mode must be 'w' or 'wb', got 'a'"):
        with atomic_write(str(path), 'a'):
            pass


def test_run_folders_with_links_are_refused(tmp_path):
    run = tmp_path / 'logs' / 'version_0'
    check_run_folder(str(run), str(tmp_path))  # not there yet: nothing to refuse
    run.mkdir(parents=True)
    (run / 'metrics.csv').write_text('epoch\n')
    check_run_folder(str(run), str(tmp_path), names=None)
    (run / 'hparams.yaml').symlink_to(tmp_path / 'target')
    with pytest.raises(RunFolderError, match=r"hparams\.yaml' is a symbolic link; pyg-grf "
                                             r"writes only regular files"):
        check_run_folder(str(run), str(tmp_path), names=None)
    check_run_folder(str(run), str(tmp_path), names=('config.yaml', ))  # only those names
    # a folder reached through a link below the root: the files would land elsewhere
    (tmp_path / 'real').mkdir()
    (tmp_path / 'logs' / 'version_1').symlink_to(tmp_path / 'real')
    with pytest.raises(RunFolderError, match=r"version_1' is a symbolic link; pyg-grf writes a "
                                             r"run only into real folders below"):
        check_run_folder(str(tmp_path / 'logs' / 'version_1'), str(tmp_path))


def test_reading_a_run_file_does_not_follow_a_link(tmp_path):
    assert read_text_nofollow(str(tmp_path / 'missing.csv')) is None
    (tmp_path / 'a.csv').write_bytes(b'epoch\n0\xff\n')
    assert read_text_nofollow(str(tmp_path / 'a.csv')).encode('utf-8', 'surrogateescape') \
        == b'epoch\n0\xff\n'
    (tmp_path / 'b.csv').symlink_to(tmp_path / 'a.csv')
    with pytest.raises(RunFolderError, match=r"b\.csv' is a symbolic link"):
        read_text_nofollow(str(tmp_path / 'b.csv'))
