import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_ddp_two_cpu_processes_reduce_metrics(tmp_path):
    out = tmp_path / 'ddp.json'
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PL_DISABLE_FORK='1')
    proc = subprocess.run([sys.executable, '-m', 'tests.lightning.ddp_script', str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result['world_size'] == 2
    assert result['local_test_size'] == result['test_size'] // 2  # each rank: half the data
    # Logged with sync_dist / torchmetrics sync: equal to one process over the whole test set.
    assert result['ddp']['test/acc'] == pytest.approx(result['single']['test/acc'], abs=1e-6)
    assert result['ddp']['test/loss'] == pytest.approx(result['single']['test/loss'], abs=1e-5)
