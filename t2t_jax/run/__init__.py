"""The run layer: what a workdir holds and how it is read and written, for every package.

`Workdir` (workdir) names each file of a workdir; `checkpoint` reads and writes its orbax
checkpoints (and averages them), `fingerprint` says what a checkpoint was trained with,
`lock` keeps one trainer per workdir, `files` writes files atomically. Nothing here imports
the trainer, so translating, scoring, exporting and plotting a finished run never load it.
"""

from t2t_jax.run.workdir import Workdir, read_metrics

__all__ = ["Workdir", "read_metrics"]
