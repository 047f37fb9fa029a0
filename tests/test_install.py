r"""The built wheel installed read-only (a shared or system install) runs the main job, and
nothing it does writes into the installed package (the numba cache goes to the user's cache)."""
import os
import shutil
import site
import stat
import subprocess
import sys

import pytest

from tests.conftest import REPO

#: Set by .ci/run to the wheel it built (its tree copy holds no pyg_grf/ to build one from).
WHEEL_ENV = 'PYG_GRF_WHEEL'


def _wheel(tmp_path):
    # the wheel of $PYG_GRF_WHEEL, else one built from a copy of the checkout's sources
    if os.environ.get(WHEEL_ENV):
        return os.environ[WHEEL_ENV]
    if not (REPO / 'pyg_grf').is_dir():
        pytest.skip(f'no pyg_grf/ in {REPO} to build a wheel from, and ${WHEEL_ENV} not set')
    src = tmp_path / 'src'
    shutil.copytree(REPO / 'pyg_grf', src / 'pyg_grf',
                    ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    for name in ('setup.cfg', 'pyproject.toml', 'MANIFEST.in', 'README.md'):
        shutil.copy(REPO / name, src / name)
    proc = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps',
                           '--no-build-isolation', '-q', '-w', str(tmp_path / 'dist'), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / 'dist').glob('pyg_grf-*.whl')
    return str(wheel)


def _files(top):
    # every file and folder below top, with what a write would change
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, top)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def _chmod_tree(top, writable):
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames, '.']:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            mode = mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP
                                                                    | stat.S_IWOTH)
            os.chmod(path, mode)


@pytest.mark.slow
def test_a_read_only_install_runs_the_main_job_and_writes_nothing_into_the_package(tmp_path):
    wheel = _wheel(tmp_path)
    # a fresh environment with only the wheel, seeing this one's packages (torch, PyG, ...)
    # after its own
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    python = str(venv / 'bin' / 'python')
    proc = subprocess.run([sys.executable, '-m', 'pip', '--python', python, 'install',
                           '--no-deps', '-q', wheel], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    purelib = subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_path('
                              '"purelib"))'], capture_output=True, text=True,
                             check=True).stdout.strip()
    # (after the install: pip would take this environment's pyg_grf for the wheel's); plain
    # paths, so their .pth files (an editable pyg_grf) are not run
    outer = [p for p in sys.path if os.path.basename(p) in ('site-packages', 'dist-packages')]
    with open(os.path.join(purelib, 'outer_site_packages.pth'), 'w') as f:
        f.write('\n'.join(dict.fromkeys(site.getsitepackages() + outer)) + '\n')
    package = os.path.join(purelib, 'pyg_grf')
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'NUMBA_CACHE_DIR', 'PYG_GRF_NUMBA')}
    env.update(XDG_CACHE_HOME=str(tmp_path / 'cache'), PYG_GRF_DATA=str(tmp_path / 'data'),
               OMP_NUM_THREADS='1')
    where = subprocess.run([python, '-c', 'import pyg_grf; print(pyg_grf.__file__)'],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert where.stdout.strip() == os.path.join(package, '__init__.py'), where

    _chmod_tree(package, writable=False)
    before = _files(package)
    try:
        # the README's main job, its first batches (from the tree's config)
        run = subprocess.run(
            [str(venv / 'bin' / 'pyg-grf'), 'fit', '--config',
             str(REPO / 'experiments' / 'configs' / 'motifs_grf.yaml'),
             f'--trainer.default_root_dir={tmp_path / "runs"}', '--trainer.max_steps=3',
             '--trainer.limit_val_batches=2', '--trainer.limit_test_batches=2',
             '--trainer.enable_progress_bar=false'],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
        after = _files(package)
    finally:
        _chmod_tree(package, writable=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'test/acc' in run.stdout
    assert list((tmp_path / 'runs').rglob('last.ckpt'))
    changed = sorted(set(before.items()) ^ set(after.items()))
    assert changed == [], f'the run wrote into the installed package: {changed[:10]}'
    # the compiled join's cache went to the user's cache folder (where numba is installed)
    numba = subprocess.run([python, '-c', 'import numba'], capture_output=True, env=env)
    if numba.returncode == 0:
        cached = list((tmp_path / 'cache' / 'pyg_grf' / 'numba').rglob('*.nbi'))
        assert cached, f"no numba cache in {tmp_path / 'cache' / 'pyg_grf' / 'numba'}"
