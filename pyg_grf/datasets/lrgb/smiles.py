r"""SMILES strings to molecular graphs (:func:`ogb.utils.smiles2graph`, needs :obj:`rdkit`), over
worker processes with a progress bar: the slow step of processing Peptides-func."""
import multiprocessing as mp
import os
from typing import List, Optional, Sequence


def _quiet_rdkit() -> None:
    r"""Silences rdkit's per-molecule warnings (a worker-process initializer: they would flood
    the terminal)."""
    from rdkit import RDLogger
    RDLogger.DisableLog('rdApp.*')


def _smiles_to_arrays(smiles: str) -> tuple:
    r"""One SMILES string as ``(x, edge_index, edge_attr, num_nodes)`` numpy arrays
    (:func:`ogb.utils.smiles2graph`); a top-level function, so worker processes can run it."""
    from ogb.utils import smiles2graph
    g = smiles2graph(smiles)
    return g['node_feat'], g['edge_index'], g['edge_feat'], int(g['num_nodes'])


def default_num_proc() -> int:
    r"""The CPUs this process may use (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def smiles_to_graphs(smiles: Sequence[str], num_proc: Optional[int] = None,
                     progress: bool = True, desc: str = 'SMILES to graphs') -> List[tuple]:
    r"""Turns SMILES strings into graphs with :func:`ogb.utils.smiles2graph` (needs
    :obj:`rdkit`), over :obj:`num_proc` worker processes in chunks, in the input order (the result
    does not depend on :obj:`num_proc`), with a progress bar.

    Args:
        smiles (sequence of str): The molecules.
        num_proc (int, optional): Worker processes; ``1`` works in this process.
            (default: :func:`default_num_proc`)
        progress (bool, optional): Show a :mod:`tqdm` progress bar (on stderr).
            (default: :obj:`True`)
        desc (str, optional): The label of the progress bar. (default: :obj:`"SMILES to graphs"`)

    Returns:
        One ``(x, edge_index, edge_attr, num_nodes)`` tuple of numpy arrays per molecule.
    """
    smiles = list(smiles)
    num_proc = default_num_proc() if num_proc is None else int(num_proc)
    if num_proc < 1:
        raise ValueError(f"num_proc must be >= 1, got {num_proc}")
    num_proc = min(num_proc, max(1, len(smiles)))
    from tqdm.auto import tqdm  # a dependency of torch_geometric (and of lightning)

    out: List[tuple] = []
    bar = tqdm(total=len(smiles), desc=desc, disable=not progress)
    try:
        if num_proc == 1:
            _quiet_rdkit()
            for s in smiles:
                out.append(_smiles_to_arrays(s))
                bar.update()
        else:
            # Fork where available (workers start at once and inherit the imports); a few chunks
            # per worker balance the load; imap keeps the input order.
            methods = mp.get_all_start_methods()
            ctx = mp.get_context('fork' if 'fork' in methods else None)
            chunksize = max(1, min(256, len(smiles) // (8 * num_proc)))
            with ctx.Pool(num_proc, initializer=_quiet_rdkit) as pool:
                for g in pool.imap(_smiles_to_arrays, smiles, chunksize=chunksize):
                    out.append(g)
                    bar.update()
    finally:
        bar.close()
        from rdkit import RDLogger
        RDLogger.EnableLog('rdApp.*')
    return out


__all__ = ['smiles_to_graphs', 'default_num_proc']
