"""`Workdir`: the one place that names the files of a t2t-train workdir.

    <workdir>/config.json      the resolved config of the latest start
    <workdir>/starts.jsonl     one record per start (time, host, step, changed fields, config)
    <workdir>/metrics.jsonl    one record per logging step, evaluation and test
    <workdir>/tensorboard/     the same metrics as TensorBoard events
    <workdir>/checkpoints/     orbax checkpoints, one directory per step (run.checkpoint)
    <workdir>/selected.json    the checkpoint choice made on dev
    <workdir>/best.json        the dev metric of each evaluation, the best checkpoints, an
                               early stop (training.best)
    <workdir>/test.<suffix>    the test split's outputs (test.de; parsing: test.words/gold/trees)
    <workdir>/lock             the trainer's lock (run.lock)
    <workdir>/vocab.*          the vocabulary, unless config.data puts it elsewhere
                               (named by data.vocab_path: the source decides its kind)
    <workdir>/before-<time>/   an earlier run's metrics, TensorBoard events, selection and
                               test outputs, set aside by a fresh start in a used workdir

Whoever reads or writes one of these goes through a Workdir, so that a file name is spelled
once and a reader (t2t-translate, t2t-export, the plots) needs no part of the trainer.
"""

import json
import os
import shutil
import socket
import time
from typing import Any

import ml_collections

from t2t_jax.run import files


class WorkdirError(OSError):
  """A --workdir that cannot serve: a file in its place, one a writer cannot write, or one a
  reader finds missing; names the path."""


class WorkdirFileError(ValueError):
  """A workdir file that does not parse as what its writer writes (config.json not a JSON
  object); names the file."""


class Workdir:
  """A workdir's path and the names of everything in it; reads and writes its small files."""

  CONFIG = "config.json"
  STARTS = "starts.jsonl"
  METRICS = "metrics.jsonl"
  TENSORBOARD = "tensorboard"
  CHECKPOINTS = "checkpoints"
  SELECTED = "selected.json"
  BEST = "best.json"
  LOCK = "lock"
  VOCAB_PREFIX = "vocab."
  TEST_PREFIX = "test."
  EARLIER_PREFIX = "before-"  # before-<UTC time>/: an earlier run's logs, set aside

  def __init__(self, path: str | os.PathLike) -> None:
    self.path = os.fspath(path)

  def __repr__(self) -> str:
    return f"Workdir({self.path!r})"

  def _join(self, name: str) -> str:
    return os.path.join(self.path, name)

  @property
  def config_file(self) -> str:
    return self._join(self.CONFIG)

  @property
  def starts_file(self) -> str:
    return self._join(self.STARTS)

  @property
  def metrics_file(self) -> str:
    return self._join(self.METRICS)

  @property
  def tensorboard_dir(self) -> str:
    return self._join(self.TENSORBOARD)

  @property
  def profile_dir(self) -> str:
    """Where jax.profiler writes plugins/profile/<time>/: the TensorBoard directory, whose
    profiler tab finds traces there."""
    return self.tensorboard_dir

  @property
  def checkpoint_dir(self) -> str:
    """Absolute, since orbax refuses a relative checkpoint directory."""
    return os.path.abspath(self._join(self.CHECKPOINTS))

  @property
  def selected_file(self) -> str:
    return self._join(self.SELECTED)

  @property
  def best_file(self) -> str:
    return self._join(self.BEST)

  @property
  def lock_file(self) -> str:
    return self._join(self.LOCK)

  def test_file(self, suffix: str) -> str:
    """Where the final test's outputs go: test.<language> or test.<words|gold|trees>."""
    return self._join(f"{self.TEST_PREFIX}{suffix}")

  def check_place(self) -> None:
    """Refuses, creating nothing, a path where a file is in the directory's place."""
    path = os.path.abspath(self.path)
    if os.path.exists(path) and not os.path.isdir(path):
      raise WorkdirError(f"--workdir={path} is not a directory (a file is in its place)")

  def create(self) -> "Workdir":
    """Creates the directory and proves it writable before any data or model work starts."""
    path = os.path.abspath(self.path)
    self.check_place()
    try:
      os.makedirs(path, exist_ok=True)
      probe = os.path.join(path, f".write_test_{os.getpid()}")
      with open(probe, "w") as f:
        f.write("ok")
      os.remove(probe)
    except OSError as e:
      raise WorkdirError(f"--workdir={path} is not writable: {e.strerror}") from e
    return Workdir(path)

  def require(self) -> "Workdir":
    """For a reader: refuses a path that is not an existing directory (a mistyped --workdir),
    creating nothing."""
    if not os.path.isdir(self.path):
      what = "is not a directory" if os.path.exists(self.path) else "does not exist"
      raise WorkdirError(f"--workdir={self.path} {what}")
    return self

  def has_checkpoints(self) -> bool:
    """Whether the checkpoint directory holds any step directory, complete or not (an
    interrupted first save's orbax temporary does not count)."""
    directory = self.checkpoint_dir
    return os.path.isdir(directory) and any(
      name.isdigit() and os.path.isdir(os.path.join(directory, name))
      for name in os.listdir(directory)
    )

  def remove_stale_temporaries(self) -> list[str]:
    """Removes the temporaries that killed writes of the trainer's files left (config.json,
    metrics.jsonl, selected.json, best.json, test.*); for the holder of the workdir lock
    only, since a live trainer's temporary would go too. Returns the entries removed."""
    if not os.path.isdir(self.path):
      return []
    owned = {self.CONFIG, self.METRICS, self.SELECTED, self.BEST}
    names = {
      entry.lstrip(".").split(files.TEMP_MARK)[0]
      for entry in os.listdir(self.path)
      if files.TEMP_MARK in entry
    }
    mine = tuple(n for n in names if n in owned or n.startswith(self.TEST_PREFIX))
    return files.remove_stale_temporaries(self.path, mine)

  # -------------------------------------------------------------------- config and starts

  def has_config(self) -> bool:
    return os.path.isfile(self.config_file)

  def config_values(self) -> dict[str, Any] | None:
    """config.json as plain JSON values; None when the workdir has none. WorkdirFileError
    names the file when it is not a JSON object (cut short, edited by hand)."""
    if not self.has_config():
      return None
    try:
      with open(self.config_file, encoding="utf-8") as f:
        values = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise WorkdirFileError(f"{self.config_file}: not a t2t-train config: {e}") from None
    if not isinstance(values, dict):
      raise WorkdirFileError(
        f"{self.config_file}: not a t2t-train config: a JSON {type(values).__name__}, not an object"
      )
    return values

  def read_config(self) -> ml_collections.ConfigDict:
    """config.json as a ConfigDict; FileNotFoundError names the file when it is missing."""
    values = self.config_values()
    if values is None:
      raise FileNotFoundError(f"{self.config_file} does not exist")
    return ml_collections.ConfigDict(values)

  def write_start(
    self,
    config: ml_collections.ConfigDict,
    step: int = 0,
    changes: dict[str, list[Any]] | None = None,
    parent: dict[str, Any] | None = None,
    run: dict[str, int] | None = None,
    not_bit_exact: list[str] | None = None,
  ) -> None:
    """config.json: the resolved config (after overrides) of the latest start; starts.jsonl:
    one record per start (time, host, step, the number of devices and processes, the fields
    changed on resume and those of them after which the steps are not bit-exact, the
    workdir and checkpoints a warm start began from, config)."""
    text = config.to_json_best_effort(indent=2, sort_keys=True)
    files.atomic_write_text(self.config_file, text + "\n")
    record = dict(
      time=time.time(),
      host=socket.gethostname(),
      pid=os.getpid(),
      step=int(step),
      changed=changes or {},
      config=json.loads(text),
    )
    if run is not None:
      record.update(run)
    if not_bit_exact:
      record["not_bit_exact"] = list(not_bit_exact)
    if parent is not None:
      record["parent"] = parent
    files.append_line(self.starts_file, json.dumps(record, sort_keys=True))

  def copy_model_files(self, output: str) -> None:
    """Copies what a translator needs besides checkpoints (config.json, the vocabulary files
    stored in the workdir) into the workdir `output`."""
    os.makedirs(output, exist_ok=True)
    for name in os.listdir(self.path):
      if name == self.CONFIG or name.startswith(self.VOCAB_PREFIX):
        shutil.copy2(self._join(name), os.path.join(output, name))

  # ------------------------------------------------------------------------------ metrics

  def append_metrics(self, record: dict[str, Any]) -> None:
    files.append_line(self.metrics_file, json.dumps(record))

  def read_metrics(self) -> list[dict[str, Any]]:
    """All records of metrics.jsonl, in order (an incomplete last line, left by a kill
    mid-write, is skipped)."""
    return files.read_json_lines(self.metrics_file)[0]

  def drop_metrics_after(self, step: int) -> tuple[int, bool] | None:
    """Keeps the records of steps <= `step` (a resume from checkpoint `step` logs the later
    ones again) and drops an incomplete last line. Returns (records dropped, whether the
    last line was incomplete), or None when nothing changed."""
    if not os.path.exists(self.metrics_file):
      return None
    records, complete = files.read_json_lines(self.metrics_file)
    kept = [r for r in records if r["step"] <= step]
    if len(kept) == len(records) and complete:
      return None
    files.atomic_write_text(self.metrics_file, "".join(json.dumps(r) + "\n" for r in kept))
    return len(records) - len(kept), not complete

  def set_aside_earlier_run(self) -> tuple[str, list[str]] | None:
    """Moves what earlier runs logged and chose (metrics.jsonl, tensorboard/, selected.json,
    best.json, test.*) into a new <workdir>/before-<UTC time>/, with a copy of config.json, so
    that a fresh start (no checkpoint left) writes its own logs without deleting theirs. Returns
    (that directory, the names moved), or None when there is nothing to move."""
    if not os.path.isdir(self.path):
      return None
    names = sorted(
      name
      for name in os.listdir(self.path)
      if name in (self.METRICS, self.TENSORBOARD, self.SELECTED, self.BEST)
      or (name.startswith(self.TEST_PREFIX) and os.path.isfile(self._join(name)))
    )
    if not names:
      return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target, n = self._join(f"{self.EARLIER_PREFIX}{stamp}"), 1
    while os.path.exists(target):  # two fresh starts within a second
      n += 1
      target = self._join(f"{self.EARLIER_PREFIX}{stamp}-{n}")
    os.makedirs(target)
    if self.has_config():
      shutil.copy2(self.config_file, os.path.join(target, self.CONFIG))
    for name in names:
      os.rename(self._join(name), os.path.join(target, name))
    return target, names

  # ---------------------------------------------------------------------------- selection

  def has_selection(self) -> bool:
    return os.path.exists(self.selected_file)

  def read_selection(self) -> dict[str, Any] | None:
    """selected.json (the checkpoint chosen on dev); None when the run chose none."""
    if not self.has_selection():
      return None
    with open(self.selected_file, encoding="utf-8") as f:
      return json.load(f)

  @staticmethod
  def selection_scores(record: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """(metric, {candidate: dev score}) of a selection record: 'metric' names the key that
    holds the scores ('dev_bleu' or 'dev_f1'); a record without it holds them under
    'dev_bleu' (written before the metric was named, whatever it measured)."""
    metric = record.get("metric", "dev_bleu")
    return metric, record[metric]

  def write_selection(self, record: dict[str, Any]) -> str:
    files.atomic_write_text(self.selected_file, json.dumps(record, indent=1))
    return self.selected_file

  # ------------------------------------------------------------------------ best record

  def read_best(self) -> dict[str, Any] | None:
    """best.json (the evaluations of the best metric and the best checkpoints); None when
    absent; ValueError (naming the file) when it is not a JSON object."""
    if not os.path.exists(self.best_file):
      return None
    with open(self.best_file, encoding="utf-8") as f:
      try:
        record = json.load(f)
      except ValueError as e:
        raise ValueError(f"{self.best_file}: not JSON ({e})") from None
    if not isinstance(record, dict):
      raise ValueError(f"{self.best_file}: not a JSON object")
    return record

  def write_best(self, record: dict[str, Any]) -> str:
    """Replaces best.json in one rename: a kill leaves the previous record or this one."""
    files.atomic_write_text(self.best_file, json.dumps(record, indent=1) + "\n")
    return self.best_file


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """The records of a workdir's metrics.jsonl (see Workdir.read_metrics)."""
  return Workdir(workdir).read_metrics()
