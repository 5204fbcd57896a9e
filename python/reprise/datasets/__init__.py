"""Offline datasets: trajectories from files into a store, with tables over them.

    ds = rp.datasets.load("hopper-medium-v2.hdf5", window=20)
    print(ds.describe())
    batch = ds.windows.sample(256)     # data[field]: [256, 20, *shape], windows inside episodes

Three layouts are read (docs/datasets.md gives each in full):

- ``d4rl``: one HDF5 file of per-step arrays of N rows each (``observations``,
  ``actions``, ``rewards``, ``terminals``, ``timeouts``, ``infos/...``); the
  ``metadata`` group and 0-d datasets are skipped.
- ``minari``: a Minari dataset directory (``data/main_data.hdf5``, one
  ``episode_<i>`` group per episode whose ``observations`` hold T+1 rows), that
  file itself, or a dataset id found under ``$MINARI_DATASETS_PATH`` (default
  ``~/.minari/datasets``). Nothing is ever downloaded.
- ``npz``: a numpy ``.npz`` of per-step arrays of N rows each.

Episodes: Minari's episode groups; otherwise an ``episode_lengths`` or
``episode_starts`` array, or else per-step markers, the first present of
``terminals``/``timeouts``, ``dones``, ``terminations``/``truncations``: a step
whose marker is non-zero ends its episode, and steps after the last marked one
form a last, partial episode.

``load`` checks everything it can from the file's metadata before it makes a
store, then writes each step once, episode by episode, into a new store sized
to the dataset: the whole dataset lives in shared memory. Files are read in
chunks of whole episodes of about 64 MB, so little memory is used besides the
store, except for npz files, whose arrays numpy reads whole. HDF5 needs h5py
(``pip install 'reprise[datasets]'``), imported only when an HDF5 file is read.

Modules, each using only those before it: ``source`` (what every reader shares: episode
boundaries, field order, the lazy h5py import), one reader per format (``d4rl``, ``minari``,
``npz``, each with its writer where there is one), ``detect`` (which format a path holds),
``dataset`` (``load``: readers into a store and tables, ``Dataset``), ``cli`` (``reprise import``).
"""

from .cli import main
from .d4rl import write_d4rl
from .dataset import Dataset, infer_signature, load
from .detect import FORMATS, detect_format
from .npz import write_npz

__all__ = ["Dataset", "load", "detect_format", "infer_signature", "write_d4rl", "write_npz", "main", "FORMATS"]
