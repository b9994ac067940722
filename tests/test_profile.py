"""config.profile_steps and t2t-bench --profile: a jax.profiler trace of the chosen steps, in
the files TensorBoard's profiler and Perfetto read."""

import glob
import gzip
import json
import os

import pytest

from t2t_jax.bench import timing
from t2t_jax.bench import train as bench_train
from t2t_jax.experiments import tiny
from t2t_jax.run.workdir import Workdir
from t2t_jax.training import checks, profile
from t2t_jax.training import trainer as train
from tests.test_quick_equivalences import _tiny_run


def _traced_steps(directory: str) -> tuple[list[str], list[int]]:
  """(the trace files under directory/plugins/profile, the step numbers of its 'train' step
  annotations in the Perfetto trace)."""
  files = sorted(glob.glob(os.path.join(directory, "plugins", "profile", "*", "*")))
  (perfetto,) = [f for f in files if f.endswith("perfetto_trace.json.gz")]
  with gzip.open(perfetto, "rt", encoding="utf-8") as f:
    events = json.load(f)["traceEvents"]
  numbers = sorted(
    int(e["args"]["step_num"]) for e in events if e.get("name") == "train" and "args" in e
  )
  return files, numbers


def test_profile_steps_writes_a_trace_of_those_steps(tmp_path):
  """A 3-step run with profile_steps='2,3': an xplane.pb (TensorBoard's profiler) and a
  Perfetto trace under <workdir>/tensorboard/plugins/profile, holding steps 2 and 3 only."""
  config = _tiny_run(3)
  config.profile_steps = "2,3"
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  files, numbers = _traced_steps(Workdir(workdir).profile_dir)
  assert any(f.endswith(".xplane.pb") for f in files), files
  assert numbers == [2, 3]


@pytest.mark.slow
def test_bench_profile_traces_the_timed_steps(tmp_path):
  """t2t-bench --profile=DIR (measure_train's profile_dir): the two timed steps' trace."""
  config = tiny.get_config()
  config.model.update(d_model=32, d_ff=64, num_layers=1, max_len=16)
  result = bench_train.measure_train(
    config, 40, 64, 8, 2, timing.CompileCounter(), profile_dir=str(tmp_path)
  )
  assert result["profiled"]
  _, numbers = _traced_steps(str(tmp_path))
  assert numbers == [1, 2]


@pytest.mark.parametrize(
  "text, message",
  [
    ("3", "must be 'START,END'"),
    ("a,b", "must be 'START,END'"),
    ("0,2", "need 1 <= START <= END"),
    ("5,2", "need 1 <= START <= END"),
  ],
)
def test_bad_profile_steps_are_refused_naming_the_field(text, message):
  config = _tiny_run(3)
  config.profile_steps = text
  with pytest.raises(train.ConfigError, match=rf"config\.profile_steps=.*{message}"):
    checks.check(config)


def test_profile_steps_parse():
  assert profile.parse_steps("") is None
  assert profile.parse_steps("4, 9") == (4, 9)
  assert profile.parse_steps("7,7") == (7, 7)
