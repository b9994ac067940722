"""train_and_evaluate(config, workdir): wiring of data, model, steps, checkpoints and logs.

The loop never copies from the devices between logging points: metrics stay on the devices
until the next progress line (the host runs at most two steps ahead), and a non-finite loss
is recorded on the device (the update is skipped) and reported at the next sync with the
step it happened at.
"""

import contextlib
import os
import signal
import time
import types
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax.typing import VariableDict

from t2t_jax import data as data_lib
from t2t_jax.decoding import SearchConfig
from t2t_jax.decoding.translator import Translator, task_constraint
from t2t_jax.evaluation import evaluate
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.run import checkpoint, fingerprint
from t2t_jax.run.files import sha256_file
from t2t_jax.run.lock import LockError, WorkdirLock
from t2t_jax.run.workdir import Workdir, WorkdirError
from t2t_jax.training import (
  best,
  checks,
  evaluation,
  optim,
  parallel,
  profile,
  steps,
  summary,
  warm_start,
)
from t2t_jax.training import config as config_lib
from t2t_jax.training.checks import ConfigError


class NonFiniteLossError(RuntimeError):
  """Training produced a NaN/inf loss or gradient."""


def checked_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with its defaults filled, once every field has been checked (ConfigError or
  DataError naming the field; training.checks): nothing read or written yet."""
  return checks.check(config).config


def check_inputs(config: ml_collections.ConfigDict, workdir: str) -> None:
  """WorkdirError for a file in the workdir's place, DataError for a missing or misaligned
  input file: before the workdir is made."""
  from t2t_jax.data import prepare

  Workdir(workdir).check_place()
  prepare.check_inputs(config_lib.with_defaults(config).data, workdir)


def build_model(
  config: ml_collections.ConfigDict, vocab_size: int
) -> tuple[Transformer, TransformerConfig]:
  model_cfg = TransformerConfig.from_dict(config.model.to_dict(), vocab_size=vocab_size)
  return Transformer(model_cfg), model_cfg


def init_state(
  model: Transformer, model_cfg: TransformerConfig, config: ml_collections.ConfigDict
) -> steps.TrainState:
  """Fresh parameters and optimizer state on the host (same on every process: same seed)."""
  dummy = jnp.ones((1, 8), jnp.int32)
  init_key, dropout_key = jax.random.split(jax.random.PRNGKey(config.seed))
  params = jax.jit(model.init)(init_key, dummy, dummy)["params"]
  tx = optim.make_optimizer(model_cfg.d_model, config.warmup_steps, config.learning_rate_factor)
  return steps.TrainState.create(params, tx, dropout_key, config.ema_decay)


def _abort(signum: int, frame: types.FrameType | None) -> NoReturn:
  del frame
  os.write(2, f"t2t-train: {signal.Signals(signum).name}: aborted without saving\n".encode())
  os._exit(128 + signum)


class StopRequested(BaseException):
  """A signal during the test translation (a BaseException, like KeyboardInterrupt, so that
  no `except Exception` on the way swallows it)."""

  def __init__(self, signal_name: str) -> None:
    super().__init__(signal_name)
    self.signal = signal_name


class StopRequest:
  """Turns SIGTERM/SIGINT into a flag the loop checks after each step (save, then exit).

  Installed from the first step until the last checkpoint is committed and the test split is
  translated: a signal while orbax writes in the background must not kill the write (the
  default SIGTERM) or end in a KeyboardInterrupt (status 130, which Slurm does not requeue).
  Inside `interrupting()` (the test translation: nothing there to finish or save) the first
  signal raises StopRequested at once instead."""

  def __init__(self) -> None:
    self.signal = None
    self._interrupt = False
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      # Outside the main thread (a notebook worker) no handler can be set.
      with contextlib.suppress(ValueError):
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del frame
    name = signal.Signals(signum).name
    if self.signal is None:
      self.signal = name
      if self._interrupt:
        raise StopRequested(name)
      return
    # A second signal while the checkpoint is written: say what is happening; a third aborts.
    os.write(
      2,
      f"\nt2t-train: {name} again: the run is finishing its step and saving a checkpoint, "
      "then it exits; "
      f"send {name} once more to abort now without this checkpoint (the last complete one "
      "is kept, a half-written one is never used)\n".encode(),
    )
    for sig in self._previous:
      signal.signal(sig, _abort)

  @contextlib.contextmanager
  def interrupting(self) -> Iterator[None]:
    """A signal inside the block raises StopRequested (one that came before raises on entry)."""
    if self.signal is not None:
      raise StopRequested(self.signal)
    self._interrupt = True
    try:
      yield
    finally:
      self._interrupt = False

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class Trainer:
  """Owns the pmapped steps and the bookkeeping of one run."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    workdir: str,
    model: Transformer,
    data: data_lib.Datasets,
    ckpts: checkpoint.Checkpoints,
    writer: summary.MetricsWriter,
    num_steps: int,
  ) -> None:
    self.config, self.workdir, self.data, self.model = config, workdir, data, model
    self.search = SearchConfig.from_config(config)  # dev and test decoding
    self.ckpts, self.writer, self.num_steps = ckpts, writer, num_steps
    # The step training ended at (the time limit may stop it before num_steps): where the
    # selection and test metrics are written.
    self.step_reached = num_steps
    schedule = optim.optimizer_schedule(
      model.config.d_model, config.warmup_steps, config.learning_rate_factor
    )
    self.accum_steps = config.grad_accum_steps
    if self.accum_steps == 1:
      self.p_train = parallel.pmap_train_step(model, config.label_smoothing, schedule)
    else:
      self.p_zero = parallel.pmap_zero_accumulator()
      self.p_accum = parallel.pmap_accumulate_step(model, config.label_smoothing)
      self.p_apply = parallel.pmap_apply_step(schedule)
    self.p_eval = parallel.pmap_eval_step(model, config.label_smoothing)
    self.num_devices = jax.device_count()
    self.last_saved = None
    self.fingerprint = None
    self.best: best.Tracker | None = None  # set by _train before the loop

  def train_step(
    self, p_state: steps.TrainState, batches: parallel.Prefetcher
  ) -> tuple[steps.TrainState, dict[str, jax.Array]]:
    """One update of the replicated state (`grad_accum_steps` batches from `batches`)."""
    if self.accum_steps == 1:
      return self.p_train(p_state, next(batches))
    accum = self.p_zero(p_state.params)
    for i in range(self.accum_steps):
      accum = self.p_accum(p_state, accum, next(batches), i)
    return self.p_apply(p_state, accum)

  def evaluate(self, p_params: VariableDict) -> dict[str, float]:
    batches = self.data.eval_batches(max_len=self.model.config.max_len)
    return evaluation.dev_loss(self.p_eval, p_params, batches)

  def translator(self, p_params: VariableDict | None = None, spec: str | None = None) -> Translator:
    """A Translator on the given parameters, or on checkpoint(s) named like t2t-translate's
    --checkpoint ('latest', 'average:N', 'STEP')."""
    if p_params is not None:
      params = parallel.unreplicate(p_params)
    else:
      self.ckpts.wait()
      params, steps_used = checkpoint.load_params(self.workdir, spec, None)
      logging.info("%s: parameters from checkpoint(s) %s", spec, steps_used)
    constraint = task_constraint(self.config.data, self.data.tokenizer)
    return Translator(
      self.model, params, self.data.tokenizer, search=self.search, constraint=constraint
    )

  def select(self) -> str:
    """The best of `select_checkpoints` by dev sacreBLEU (parsing: dev F1), decoded with the
    dev beam (`evaluation.dev_search`), written to <workdir>/selected.json."""
    n = self.config.select_num_sentences
    pairs = self.data.dev_pairs[:n] if n else self.data.dev_pairs
    metric, metric_name, name = evaluate.bleu, "dev_bleu", "sacreBLEU"
    if evaluate.is_parsing(self.config.data):
      golds = evaluate.gold_trees(self.config.data, "dev", pairs)
      leaves = self.config.data.tree_leaves
      metric, metric_name, name = (
        lambda t, p, search: evaluate.f1(t, p, golds, search, leaves=leaves).f1,
        "dev_f1",
        "bracket F1",
      )
    search = evaluation.dev_search(self.config.bleu_beam_size, self.search)
    selection = evaluation.select_checkpoint(
      self.ckpts,
      self.config.select_checkpoints,
      pairs,
      lambda spec: self.translator(None, spec),
      search,
      metric,
      metric_name,
    )
    evaluation.write_selection(self.workdir, selection, search)
    summary.log(
      f"checkpoint selection on dev ({len(pairs)} sentences, {name}, beam {search.beam_size}):\n"
      f"{selection.table()}"
    )
    self.writer.write(
      self.step_reached, {f"selected_{metric_name}": selection.scores[selection.best]}
    )
    return selection.best

  def test_spec(self) -> str | None:
    """Which checkpoint(s) translate the test split: chosen on dev, the average of the last
    `average_checkpoints`, or (None) the parameters in memory."""
    if self.config.select_checkpoints:
      return self.select()
    if self.config.average_checkpoints > 1 and self.ckpts.steps():
      n = min(self.config.average_checkpoints, len(self.ckpts.steps()))
      return f"average:{n}"
    return None

  def dev_bleu(self, p_params: VariableDict) -> dict[str, float]:
    """sacreBLEU (parsing: bracket F1) of the first `bleu_num_sentences` dev pairs, with a
    beam of `bleu_beam_size` (0: `beam_size`; greedy keeps a wide beam like parsing's 21 from
    taking minutes of every evaluation)."""
    pairs = self.data.dev_pairs[: self.config.bleu_num_sentences]
    if not pairs:
      return {}
    return evaluate.dev_metrics(
      self.translator(p_params),
      pairs,
      evaluation.dev_search(self.config.bleu_beam_size, self.search),
      self.config.data,
      self.data.split_name("dev"),
    )

  def test(self, p_params: VariableDict) -> dict[str, float]:
    """Translates the test split: prints examples and scores, logs test_* metrics.

    Every process takes part (they restore checkpoints together: orbax synchronises them);
    only process 0's metrics and files are written.
    """
    pairs = self.data.test_pairs
    if not pairs:
      return {}
    spec = self.test_spec()
    translator = self.translator(p_params if spec is None else None, spec)
    summary.log(
      f"test: parameters from {spec or 'the last step'}"
      + (f" = checkpoint(s) {checkpoint.choose_steps(self.ckpts, spec)}" if spec else "")
    )
    if evaluate.is_parsing(self.config.data):
      golds = evaluate.gold_trees(self.config.data, "test", pairs)
      metrics, report = evaluation.parse_test(
        translator,
        pairs,
        golds,
        self.search,
        self.workdir,
        self.data.split_name("test"),
        self.config.data.tree_leaves,
      )
      self.writer.write(self.step_reached, metrics)
      summary.log(report)
      return metrics
    lang = data_lib.target_language(self.config.data)
    metrics, report = evaluation.translate_test(
      translator,
      pairs,
      lang,
      self.search,
      Workdir(self.workdir).test_file(lang),
      self.data.split_name("test"),
    )
    self.writer.write(self.step_reached, metrics)
    summary.log(report)
    return metrics

  def check_finite(self, p_state: steps.TrainState) -> None:
    bad = int(np.asarray(jax.device_get(p_state.bad_step[0])))
    if bad >= 0:
      kept = (
        f"the last good checkpoint (step {self.last_saved}) is kept in {self.ckpts.directory}"
        if self.last_saved is not None
        else "no checkpoint had been saved yet"
      )
      raise NonFiniteLossError(
        f"non-finite loss or gradient at step {bad}: training stopped without saving; {kept}"
      )

  def save(self, p_state: steps.TrainState, prefetcher: parallel.Prefetcher) -> None:
    self.check_finite(p_state)
    state = parallel.unreplicate(p_state)
    step = int(state.step)
    self.ckpts.save(step, state, prefetcher.state(), self.fingerprint)
    self.last_saved = step


def _sum_metrics(pending: Sequence[dict[str, jax.Array]]) -> dict[str, float]:
  host = [parallel.host_metrics(m) for m in pending]
  total = {k: sum(h[k] for h in host) for k in ("loss", "nll", "correct", "denominator")}
  denom = max(total["denominator"], 1.0)
  return dict(
    loss=total["loss"] / denom,
    nll=total["nll"] / denom,
    accuracy=total["correct"] / denom,
    tokens=total["denominator"],
    learning_rate=host[-1]["learning_rate"],
    grad_norm=host[-1]["grad_norm"],
  )


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains `config` in `workdir`, resuming from its latest checkpoint; returns last metrics.

  Process 0 holds the workdir lock for the whole run, so that a second run on the same
  workdir stops at once instead of pruning this one's checkpoints. Fields `config` lacks
  take their defaults from config_lib (TrainConfig, TransformerConfig).
  """
  config = checked_config(config)
  check_inputs(config, workdir)
  workdir = Workdir(workdir).create().path
  lock = WorkdirLock(workdir)
  if jax.process_index() == 0:
    lock.acquire()
    removed = Workdir(workdir).remove_stale_temporaries()
    if removed:
      logging.info("removed temporaries of killed writes: %s", ", ".join(removed))
  try:
    return _train(config, workdir)
  finally:
    lock.release()


def _train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """The initial state comes from the workdir's own newest checkpoint, else from
  config.init_from (warm_start), else from config.seed; never from two of them."""
  parent = warm_start.resolve(config, workdir)  # None: no init_from, or own checkpoints
  if parent is not None:
    warm_start.adopt_vocabulary(config, workdir, parent, jax.process_index())
  data = data_lib.get_datasets(
    config.data,
    workdir,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    num_local_devices=parallel.local_device_count(),
  )
  model, model_cfg = build_model(config, data.tokenizer.vocab_size)
  state = init_state(model, model_cfg, config)
  ckpts = checkpoint.Checkpoints(workdir, config.keep_checkpoints, owner=True)
  train_iter = data.train_iter()
  vocab = str(data_lib.vocab_path(config.data, workdir))
  run = dict(devices=jax.device_count(), processes=jax.process_count())
  current = fingerprint.make(
    config, sha256_file(vocab), parent and parent.record(), data.train_identity, run
  )
  state, changes, resumed = _resume(ckpts, state, train_iter, current)
  if resumed is None and parent is not None:
    state = warm_start.initial_state(state, parent)
  tracker = best.Tracker(config, workdir, write=jax.process_index() == 0, read=int(state.step) > 0)
  standing = tracker.rewind(int(state.step))
  ckpts.protect(standing.best_steps)
  if standing.stopped_at is not None:
    summary.log(
      f"{workdir} has stopped: {tracker.stop_line()}; not training on (raise config.patience, "
      "or set it to 0, to continue)"
    )
    ckpts.close()
    return dict(
      step=int(state.step),
      stopped_by=None,
      time_limit_reached=False,
      early_stopped_at=standing.stopped_at,
    )
  writer = summary.MetricsWriter(
    workdir, enabled=jax.process_index() == 0, resume_step=int(state.step)
  )
  if jax.process_index() == 0:
    Workdir(workdir).write_start(
      config,
      int(state.step),
      changes,
      current.get("parent"),
      run=run,
      not_bit_exact=sorted(set(changes) & fingerprint.NOT_BIT_EXACT),
    )
  _log_sizes(config, state, data)
  trainer = Trainer(config, workdir, model, data, ckpts, writer, config.num_train_steps)
  trainer.last_saved = ckpts.latest_step()
  trainer.fingerprint = current
  trainer.best = tracker
  stop = StopRequest()
  try:
    last, p_state = _loop(trainer, state, train_iter, stop)
    # The last save is committed while the handlers still cover it; a signal that came
    # meanwhile skips the test translation, which the next run then does without training.
    ckpts.wait()
    if last["stopped_by"] is None:
      last["stopped_by"] = _agreed_stop(stop)
    if last["stopped_by"] is None and config.test_at_end:
      trainer.step_reached = int(last["step"])
      try:
        with stop.interrupting():
          last.update(trainer.test(p_state.params))
      except StopRequested as e:
        logging.info(
          "%s received during the test translation: stopping; the next run translates the "
          "test split from the saved step %d without training",
          e.signal,
          last["step"],
        )
        last["stopped_by"] = e.signal
    if last["stopped_by"] is not None:
      return last
    if jax.process_index() == 0:
      summary.log(
        f"done at step {last['step']}: checkpoints in {ckpts.directory}, metrics in "
        f"{writer.jsonl_path} (TensorBoard: tensorboard --logdir "
        f"{Workdir(workdir).tensorboard_dir}); translate with t2t-translate "
        f"--workdir={workdir}"
      )
    ckpts.wait()
    return last
  finally:
    with contextlib.suppress(checkpoint.CheckpointSaveError):  # reported where it was raised
      ckpts.wait()
    stop.restore()
    writer.close()


def _resume(
  ckpts: checkpoint.Checkpoints,
  state: steps.TrainState,
  train_iter: parallel.StatefulIterator,
  current: dict[str, Any],
) -> tuple[steps.TrainState, dict[str, list[Any]], int | None]:
  """(state, changed config fields, step) from the newest checkpoint that restores and whose
  fingerprint matches `current`; (`state`, {}, None) when the workdir has no checkpoint.

  A resumed warm-started run keeps naming its parent: the checkpoint's 'parent' record goes
  into `current`, which later checkpoints store."""
  changes = {}

  def check(step: int, saved: dict[str, Any] | None) -> None:
    nonlocal changes
    where = f"checkpoint {ckpts.path(step)}"
    if saved is None:
      logging.warning("%s has no fingerprint: its config and vocabulary are not checked", where)
      return
    if "train_data" not in saved:
      logging.warning("%s has no training-data identity: the corpus is not checked", where)
    changes = fingerprint.compare(saved, current, where)
    current.pop("parent", None)
    if "parent" in saved:
      current["parent"] = saved["parent"]

  # Every process resumes from the same step: the newest one all of them can read.
  state, data_state, step = ckpts.restore_newest(state, check, parallel.common_steps)
  if step is None:
    how = "config.init_from" if "parent" in current else "scratch"
    logging.info("no checkpoint in %s: starting from %s", ckpts.directory, how)
    return state, {}, None
  if data_state is not None:
    train_iter.set_state(data_state)
  for field, (old, new) in changes.items():
    name = field if field in fingerprint.RUN_FIELDS else f"config.{field}"
    if field in fingerprint.NOT_BIT_EXACT:
      logging.warning(
        "resuming with %s changed from %r to %r: the steps from here differ from an "
        "uninterrupted run's by rounding (recorded in starts.jsonl)",
        name,
        old,
        new,
      )
    else:
      logging.info("resuming with %s changed from %r to %r", name, old, new)
  logging.info("resumed from %s/%d", ckpts.directory, step)
  return state, changes, step


def _log_sizes(
  config: ml_collections.ConfigDict, state: steps.TrainState, data: data_lib.Datasets
) -> None:
  n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(state.params))
  logging.info(
    "model: %s parameters; %d devices (%d local, %d processes); global batch "
    "~%d tokens per side per step, ~%d per device; %d accumulation step(s)",
    f"{n_params:,}",
    jax.device_count(),
    jax.local_device_count(),
    jax.process_count(),
    config.data.tokens_per_batch * config.grad_accum_steps,
    config.data.tokens_per_batch // jax.device_count(),
    config.grad_accum_steps,
  )


# Errors whose message says all (file, field, step, path): t2t-train prints one line, no
# traceback.
EXPLAINED_ERRORS = (
  ConfigError,
  data_lib.DataError,
  checkpoint.CheckpointMismatchError,
  checkpoint.CheckpointDamagedError,
  checkpoint.CheckpointSaveError,
  fingerprint.FingerprintError,
  best.MetricChangedError,
  LockError,
  WorkdirError,
  NonFiniteLossError,
  warm_start.WarmStartError,
)

MAX_STEPS_AHEAD = 2


def _agreed_stop(stop: StopRequest, step: int = 0, every: int = 1) -> str | None:
  """The signal to stop on now. With several hosts, all must stop (and save) at the same
  step, so they agree at logging steps whether any of them was signalled."""
  if jax.process_count() == 1:
    return stop.signal
  if step % every or not parallel.any_host(stop.signal is not None):
    return None
  return stop.signal or "SIGTERM (on another host)"


def _loop(
  trainer: Trainer,
  state: steps.TrainState,
  train_iter: parallel.StatefulIterator,
  stop: StopRequest,
) -> tuple[dict[str, Any], steps.TrainState]:
  """Steps until num_train_steps, a signal or the time limit; returns (the last metrics with
  'step', 'stopped_by' and 'time_limit_reached', the replicated final state)."""
  config = trainer.config
  step = int(state.step)
  p_state = parallel.replicate(state)
  prefetcher = parallel.Prefetcher(train_iter, size=config.prefetch_batches)
  pending, last = [], {}
  t_last, step_last = time.time(), step
  limit_s = 60.0 * config.train_time_limit_minutes
  deadline = time.time() + limit_s if limit_s > 0 else None
  timed_out, stopping, early_stop = False, None, None
  profiler = profile.StepProfiler(
    profile.parse_steps(config.profile_steps),
    Workdir(trainer.workdir).profile_dir,
    enabled=jax.process_index() == 0,
  )
  # Wall-clock curves start here, not at the first progress line.
  trainer.writer.write(step, dict(train_start=1.0))
  while step < trainer.num_steps and not timed_out:
    with profiler.step(step + 1):
      p_state, metrics = trainer.train_step(p_state, prefetcher)
    pending.append(metrics)
    step += 1
    profiler.finished(step, metrics)
    # Dispatch is asynchronous: without a bound the host could run a hundred steps ahead
    # of the devices, and a SIGTERM would wait for all of them before saving. Waiting for
    # the step before last costs nothing (it is finished by the time this one runs).
    if len(pending) > MAX_STEPS_AHEAD:
      jax.block_until_ready(pending[-1 - MAX_STEPS_AHEAD])
    # The time limit ends training like the last step: evaluate, save, then test. One
    # process checks it after every step; several check at logging steps only, where every
    # host agrees on whether it was reached (a collective each time).
    one_host = jax.process_count() == 1
    if deadline is not None and (one_host or step % config.log_every_steps == 0):
      timed_out = parallel.any_host(time.time() > deadline)
    if timed_out:
      logging.info("train_time_limit_minutes=%s reached at step %d", limit_s / 60, step)
    stopping = _agreed_stop(stop, step, config.log_every_steps)
    entered_best = False
    final = step == trainer.num_steps or timed_out
    eval_due = step % config.eval_every_steps == 0 or final
    if step % config.log_every_steps == 0 or eval_due or stopping:
      trainer.check_finite(p_state)
      trainer.ckpts.check_for_errors()
      last = _sum_metrics(pending)
      now = time.time()
      steps_per_s = (step - step_last) / max(now - t_last, 1e-9)
      tokens_per_s = last["tokens"] / max(now - t_last, 1e-9)
      t_last, step_last, pending = now, step, []
      eval_metrics = {}
      if eval_due or (config.bleu_every_steps and step % config.bleu_every_steps == 0):
        logging.info("step %d: evaluating on dev", step)
      if eval_due:
        eval_metrics = trainer.evaluate(p_state.params)
      if config.bleu_every_steps and (step % config.bleu_every_steps == 0 or final):
        eval_metrics.update(trainer.dev_bleu(p_state.params))
      trainer.writer.write(
        step,
        dict(last, steps_per_second=steps_per_s, tokens_per_second=tokens_per_s, **eval_metrics),
      )
      if jax.process_index() == 0:
        summary.log(
          summary.progress_line(
            step,
            trainer.num_steps,
            last,
            steps_per_s,
            tokens_per_s,
            trainer.num_devices,
            eval_metrics,
          )
        )
      last.update(eval_metrics)
      entered_best, early_stop = _rank(trainer, step, eval_metrics)
    # An evaluation among the best is saved: the best checkpoints are kept apart.
    due = step % config.checkpoint_every_steps == 0 or final or entered_best
    if due or stopping or early_stop:
      trainer.save(p_state, prefetcher)
    if early_stop:
      summary.log(trainer.best.stop_line())
      break
    if stopping:
      trainer.ckpts.wait()  # "saved" once orbax has committed it, not when it is queued
      logging.info(
        "%s received: saved step %d to %s; exiting", stopping, step, trainer.ckpts.directory
      )
      break
  profiler.stop()
  last["step"] = step
  last["stopped_by"] = stopping
  last["time_limit_reached"] = timed_out
  last["early_stopped_at"] = early_stop
  return last, p_state


def _rank(trainer: Trainer, step: int, eval_metrics: dict[str, float]) -> tuple[bool, int | None]:
  """Records the evaluation of the best metric (if made at `step`) in best.json and protects
  the best checkpoints from pruning; (whether `step` is among the best kept, the step of an
  early stop or None)."""
  standing = trainer.best.add(step, eval_metrics)
  if standing is None:
    return False, None
  trainer.ckpts.protect(standing.best_steps)
  return step in standing.best_steps, standing.stopped_at
