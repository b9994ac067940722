"""The only pmap-aware module: device placement, replication and the pmapped steps.

Batches arrive from the data pipeline as numpy arrays shaped [local_devices, rows, length];
state lives replicated on every local device. Moving to jit + sharding later means changing
this file only.
"""

import collections
import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np
import optax
from flax import jax_utils

from t2t_jax.model import Transformer
from t2t_jax.training import losses, steps

AXIS = steps.AXIS
PyTree = Any  # arrays in nested containers, as jax.tree_util sees them
Batch = dict[str, np.ndarray]  # a host batch, each leaf [local_devices, rows, length]


class StatefulIterator(Protocol):
  """A batch iterator whose position can be saved and restored (grain's DatasetIterator)."""

  def __next__(self) -> Batch: ...

  def get_state(self) -> dict[str, Any]: ...

  def set_state(self, state: dict[str, Any]) -> None: ...


def local_device_count() -> int:
  return jax.local_device_count()


def replicate(tree: PyTree) -> PyTree:
  """Copies a host pytree onto every local device (leading axis = device).

  Goes through a pmapped identity so the arrays carry exactly the sharding the pmapped
  steps return: the first step's output then feeds the second without a recompilation.
  """
  return _pmap_identity(jax_utils.replicate(tree))


_pmap_identity = jax.pmap(lambda x: x, axis_name=AXIS)


def unreplicate(tree: PyTree) -> PyTree:
  """The copy on the first local device, fetched to the host as numpy."""
  return jax.device_get(jax_utils.unreplicate(tree))


def _device_sharding() -> jax.NamedSharding:
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()), (AXIS,))
  return jax.NamedSharding(mesh, jax.P(AXIS))


def _reused(build: Callable[..., Any]) -> Callable[..., Any]:
  """The pmapped steps of one (model, label smoothing, schedule) are built once per process:
  jax caches traces per function object, so a second Trainer with equal settings (a resumed
  run, another run in a notebook or test) reuses the first one's programs instead of
  tracing and compiling them again. Models and configs are frozen, hence hashable."""
  return functools.lru_cache(maxsize=16)(build)


def shard(batch: Batch) -> dict[str, jax.Array]:
  """Puts a [local_devices, ...] host batch onto the devices, one slice each."""
  sharding = _device_sharding()
  return jax.tree.map(lambda x: jax.device_put(x, sharding), batch)


@_reused
def pmap_train_step(
  model: Transformer, label_smoothing: float, schedule: optax.Schedule
) -> Callable[..., tuple[steps.TrainState, dict[str, jax.Array]]]:
  return jax.pmap(
    functools.partial(
      steps.train_step, model=model, label_smoothing=label_smoothing, schedule=schedule
    ),
    axis_name=AXIS,
    donate_argnums=(0,),
  )


@_reused
def pmap_accumulate_step(
  model: Transformer, label_smoothing: float
) -> Callable[..., steps.Accumulator]:
  return jax.pmap(
    functools.partial(steps.accumulate_step, model=model, label_smoothing=label_smoothing),
    axis_name=AXIS,
    donate_argnums=(1,),
    in_axes=(0, 0, 0, None),
  )


@_reused
def pmap_apply_step(
  schedule: optax.Schedule,
) -> Callable[..., tuple[steps.TrainState, dict[str, jax.Array]]]:
  # Only the state is donated: the new parameters and moments take its buffers, and the
  # summed gradients have no output of their shape left to reuse theirs.
  return jax.pmap(
    functools.partial(steps.apply_step, schedule=schedule), axis_name=AXIS, donate_argnums=(0,)
  )


@_reused
def pmap_zero_accumulator() -> Callable[..., steps.Accumulator]:
  # The same axis name as the steps: zeros carrying another name would make the first
  # accumulate step compile a second program for micro-batch 1's accumulator.
  return jax.pmap(steps.zero_accumulator, axis_name=AXIS)


@_reused
def pmap_eval_step(model: Transformer, label_smoothing: float) -> Callable[..., losses.Sums]:
  return jax.pmap(
    functools.partial(steps.eval_step, model=model, label_smoothing=label_smoothing), axis_name=AXIS
  )


class Prefetcher:
  """Keeps `size` batches on the devices ahead of the step loop.

  Remembers the iterator state taken before each prefetched batch, so `state()` is the
  state from which the next unconsumed batch would be produced: checkpoints saved while
  batches sit in the queue still resume at exactly the right batch.
  """

  def __init__(self, iterator: StatefulIterator, size: int = 2) -> None:
    self._iterator = iterator
    self._queue = collections.deque()
    self._size = max(size, 1)

  def _fill(self) -> None:
    while len(self._queue) < self._size:
      before = copy.deepcopy(self._iterator.get_state())
      self._queue.append((before, shard(next(self._iterator))))

  def __next__(self) -> dict[str, jax.Array]:
    self._fill()
    return self._queue.popleft()[1]

  def state(self) -> dict[str, Any]:
    return self._queue[0][0] if self._queue else self._iterator.get_state()


def any_host(flag: bool) -> bool:
  """True on every process when `flag` is True on any (a collective: call it on all hosts)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils

  return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))


def common_steps(steps: Sequence[int]) -> list[int]:
  """The steps in `steps` on every process, sorted (a collective: call it on all hosts).

  Two gathers: the longest list's length, then every list padded to it with -1."""
  if jax.process_count() == 1:
    return sorted(int(s) for s in steps)
  from jax.experimental import multihost_utils

  mine = sorted(int(s) for s in steps)
  width = int(np.max(multihost_utils.process_allgather(np.asarray(len(mine), np.int32))))
  padded = np.full(max(width, 1), -1, np.int32)
  padded[: len(mine)] = mine
  every = np.asarray(multihost_utils.process_allgather(padded)).reshape(jax.process_count(), -1)
  shared = set(every[0].tolist())
  for row in every[1:]:
    shared &= set(row.tolist())
  return sorted(s for s in shared if s >= 0)


def host_metrics(metrics: Mapping[str, jax.Array]) -> dict[str, float]:
  """Device-0 copy of psum-reduced metrics as python floats (a host sync)."""
  return {k: float(np.asarray(v)) for k, v in unreplicate(metrics).items()}
