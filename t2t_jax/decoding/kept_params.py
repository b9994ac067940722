"""A workdir's chosen parameters kept as one plain numpy file in the compilation cache.

Reading a checkpoint for translation goes through orbax: its import, the step's metadata
and the restore are most of a second of every t2t-translate start, and averaging N
checkpoints reads N of them. What a translation reads - the parameters a --checkpoint
choice names (averaged where it names several), the steps they came from and those steps'
vocabulary fingerprints - is kept after the first read as one uncompressed `.npz` beside
the compiled programs (`compilation.enable`'s directory), which a later process reads with
numpy alone.

The file's name is a digest of everything the choice depends on: the workdir's real path,
the resolved choice ('latest', 'average:5', ...), the parameter shapes the model expects,
and the name, inode, size and modification time of every file and folder under
<workdir>/checkpoints and of best.json and selected.json. A new, removed or rewritten
checkpoint, or a new dev selection, is another name: the next read goes to the checkpoints
again. Nothing in the workdir is written. An entry that cannot be read, or whose arrays are
not the model's, is ignored (logged) and made again; entries are bounded with the
compiled programs (`compilation.trim`, least recently used first), and parameters larger
than a quarter of that bound are not kept.
"""

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import logging

from t2t_jax import compilation
from t2t_jax.run.files import atomic_open
from t2t_jax.run.workdir import Workdir

PREFIX = "t2t-params-"
FORMAT = 1  # bumped when the entry's layout changes
MAX_KEPT_BYTES = compilation.MAX_BYTES // 4
META = "meta.json"  # the entry's member holding steps and fingerprints
SEP = "/"  # joins a parameter's path into its member name


@dataclasses.dataclass(frozen=True)
class Kept:
  """What a translation reads of a workdir for one checkpoint choice."""

  params: Any  # nested dicts of numpy arrays (the parameters, averaged where chosen so)
  steps: list[int]
  vocab_sha256: list[str | None]  # each step's fingerprint of its vocabulary (None: none)


def _stat(path: str) -> str:
  try:
    st = os.stat(path)
  except OSError:
    return "-"
  return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _tree_listing(directory: str) -> list[str]:
  """(relative path, inode, size, mtime) of everything under `directory`, sorted."""
  out = [f".:{_stat(directory)}"]
  for root, dirs, files in os.walk(directory):
    dirs.sort()
    for name in sorted(dirs + files):
      path = os.path.join(root, name)
      out.append(f"{os.path.relpath(path, directory)}:{_stat(path)}")
  return out


def _shapes_text(params_like: Any) -> str:
  leaves = jax.tree_util.tree_flatten_with_path(params_like)[0]
  return ";".join(
    f"{jax.tree_util.keystr(p)}={tuple(x.shape)}:{np.dtype(x.dtype).name}" for p, x in leaves
  )


def key(workdir: str, spec: str, params_like: Any) -> str:
  """The digest naming the entry of `spec` (resolved) for `workdir` and these shapes."""
  run = Workdir(workdir)
  parts = [
    f"format {FORMAT}",
    os.path.realpath(workdir),
    spec,
    _shapes_text(params_like),
    f"best {_stat(run.best_file)}",
    f"selected {_stat(run.selected_file)}",
    *_tree_listing(run.checkpoint_dir),
  ]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def path_of(directory: str, digest: str) -> str:
  return os.path.join(directory, PREFIX + digest + compilation.ENTRY_SUFFIX)


def _flatten(tree: Any, prefix: str = "") -> dict[str, np.ndarray] | None:
  """{'encoder/layer_0/kernel': array, ...}; None for a tree these names cannot hold."""
  out: dict[str, np.ndarray] = {}
  for name, value in tree.items():
    if not isinstance(name, str) or not name or SEP in name or name == META:
      return None
    if isinstance(value, dict):
      inner = _flatten(value, prefix + name + SEP)
      if inner is None:
        return None
      out.update(inner)
    else:
      out[prefix + name] = np.asarray(value)
  return out


def _unflatten(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
  tree: dict[str, Any] = {}
  for name, value in arrays.items():
    node = tree
    *parents, leaf = name.split(SEP)
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def _fits(params: Any, params_like: Any) -> bool:
  """The same tree, shapes and dtypes as the model's parameters."""
  got, got_def = jax.tree_util.tree_flatten(params)
  want, want_def = jax.tree_util.tree_flatten(params_like)
  return got_def == want_def and all(
    a.shape == tuple(b.shape) and a.dtype == np.dtype(b.dtype) for a, b in zip(got, want)
  )


def read(directory: str, digest: str, params_like: Any) -> Kept | None:
  """The entry `digest` in `directory`, or None (none, unreadable, or not these shapes)."""
  path = path_of(directory, digest)
  try:
    with np.load(path, allow_pickle=False) as entry:
      meta = json.loads(entry[META].tobytes().decode())
      params = _unflatten({name: entry[name] for name in entry.files if name != META})
    kept = Kept(params, [int(s) for s in meta["steps"]], list(meta["vocab_sha256"]))
  except FileNotFoundError:
    return None
  except Exception as e:  # any unreadable entry is made again from the checkpoints
    logging.info("kept parameters %s not used (%s: %s)", path, type(e).__name__, e)
    return None
  if not _fits(kept.params, params_like) or len(kept.vocab_sha256) != len(kept.steps):
    logging.info("kept parameters %s not used (not the model's shapes)", path)
    return None
  with contextlib.suppress(OSError):
    os.utime(path)  # trim() drops the least recently used first
  return kept


def write(directory: str, digest: str, kept: Kept) -> bool:
  """Keeps `kept` as the entry `digest`; False (logged at most) where it is not kept: too
  large, names a file cannot hold, or the directory refuses the write."""
  arrays = _flatten(kept.params)
  if arrays is None or sum(a.nbytes for a in arrays.values()) > MAX_KEPT_BYTES:
    return False
  meta = json.dumps(dict(steps=kept.steps, vocab_sha256=kept.vocab_sha256)).encode()
  arrays[META] = np.frombuffer(meta, np.uint8)
  path = path_of(directory, digest)
  try:
    with atomic_open(path, "wb") as f:
      np.savez(f, **arrays)
  except OSError as e:  # not keeping them is only slower later
    logging.info("parameters not kept at %s (%s)", path, e)
    return False
  return True


def load(
  workdir: str, spec: str, params_like: Any, restore: Callable[[], Kept]
) -> tuple[Kept, bool]:
  """(what `spec` names, whether it came from a kept entry): the kept entry where the
  compilation cache is on and holds one for the checkpoints as they are now, else
  `restore()` (the checkpoints), then kept for the next process."""
  directory = compilation.directory()
  if directory is None:
    return restore(), False
  digest = key(workdir, spec, params_like)
  kept = read(directory, digest, params_like)
  if kept is not None:
    return kept, True
  kept = restore()
  write(directory, digest, kept)
  return kept, False
