"""Wrong command lines of every command: one line on stderr naming the problem and the way
out, exit status 2 for a wrong command line (1 when the command line is well formed but a
file it names is not), no log line before it, no traceback, and nothing created on disk.

The table runs each command as its console script does (`run()`: flag parsing, absl's
app.run, the interpreter's handling of SystemExit) in a forked child of one interpreter that
loaded the libraries once (tests.support.forked_commands); `--help` of each command exits 0.
A few cases also run as real processes, without JAX_PLATFORMS, where JAX's start-up logs
("Unable to initialize backend 'tpu'") would show if a check came after the devices.
"""

import os
import subprocess
import sys

import pytest

from t2t_jax.run.workdir import Workdir
from tests import support
from tests.test_train import small_config

USAGE, FAILED = 2, 1


def _cases(root: str) -> dict[str, tuple[str, list[str], int, str]]:
  """name -> (command, arguments, exit status, what its one line must say)."""
  new, good, missing = f"{root}/new", f"{root}/good", f"{root}/missing"
  src, ref, short = f"{root}/src.txt", f"{root}/ref.txt", f"{root}/short.txt"
  textfiles = [
    "--config.data.source=textfiles",
    f"--config.data.train_source={src}",
    f"--config.data.train_target={short}",
  ]
  no_corpus = ["--experiment=multi30k", f"--config.corpus_dir={missing}"]
  misaligned = f"train files are not aligned: {src} has 3 lines but {short} has 2 lines"
  w, wn = f"--workdir={good}", f"--workdir={new}"
  t = {  # t2t-train
    "train-no-workdir": ([], USAGE, "--workdir is required: the run's directory, e.g."),
    "train-unknown-experiment": (
      ["--experiment=nope", wn],
      USAGE,
      "--experiment=nope: unknown experiment; available: base,",
    ),
    "train-unknown-table3-row": (
      ["--experiment=table3:Z9", wn],
      USAGE,
      "--experiment=table3:Z9: table3: unknown row 'Z9'; rows: base, A1,",
    ),
    "train-unknown-direction": (
      ["--experiment=multi30k:en-fr", wn],
      USAGE,
      "--experiment=multi30k:en-fr: multi30k: direction 'en-fr' must be 'en-de' or 'de-en'",
    ),
    "train-field-not-a-number": (
      [wn, "--config.num_train_steps=abc"],
      USAGE,
      "--config.num_train_steps=abc: invalid literal for int() with base 10: 'abc' "
      "(t2t-train --experiment=NAME --helpconfig lists the fields)",
    ),
    "train-misspelled-field": (
      [wn, "--config.warmup_step=5"],
      USAGE,
      "config has no field 'warmup_step' (nearest: warmup_steps",
    ),
    "train-bad-batching": (
      [wn, "--config.data.batching=foo"],
      USAGE,
      "config.data.batching='foo' must be one of ('bucket', 'pack')",
    ),
    "train-zero-log-steps": (
      [wn, "--config.log_every_steps=0"],
      USAGE,
      "config.log_every_steps=0 must be a positive integer",
    ),
    "train-unknown-source": (
      [wn, "--config.data.source=nosuch"],
      USAGE,
      "config.data.source='nosuch'",
    ),
    "train-positional-argument": (
      [wn, "extra"],
      USAGE,
      "unexpected arguments ['extra']: flags are written --name=value",
    ),
    "train-unknown-flag": ([wn, "--nosuchflag"], USAGE, "Unknown command line flag 'nosuchflag'"),
    "train-bad-enum-flag": (
      [wn, "--distributed=maybe"],
      USAGE,
      "flag --distributed=maybe: value should be one of <auto|off>",
    ),
    "train-missing-corpus": (
      [wn, *no_corpus],
      FAILED,
      f"{missing}/train.en: no such file (config.data.train_source)",
    ),
    "train-misaligned-files": ([wn, *textfiles], FAILED, misaligned),
  }
  p = {  # t2t-prepare
    "prepare-no-workdir": ([], USAGE, "--workdir is required: the workdir t2t-train will use"),
    "prepare-unknown-experiment": (["--experiment=nope", wn], USAGE, "unknown experiment"),
    "prepare-bad-batching": (
      [wn, "--config.data.batching=foo"],
      USAGE,
      "config.data.batching='foo' must be one of",
    ),
    "prepare-missing-corpus": ([wn, *no_corpus], FAILED, f"{missing}/train.en: no such file"),
    "prepare-misaligned-files": ([wn, *textfiles], FAILED, misaligned),
  }
  x = {  # t2t-translate
    "translate-no-workdir": ([f"--input={src}"], USAGE, "--workdir is required: a t2t-train"),
    "translate-beam-0": ([w, "--beam_size=0"], USAGE, "--beam_size=0 must be >= 1 (1: greedy)"),
    "translate-average-0": (
      [w, "--checkpoint=average:0"],
      USAGE,
      "--checkpoint=average:0: not 'auto', 'selected', 'latest', 'average:N', 'best', "
      "'best:N', 'ema' or a step (N >= 1)",
    ),
    "translate-checkpoint-typo": ([w, "--checkpoint=bset"], USAGE, "--checkpoint=bset: not"),
    "translate-reference-and-nbest": (
      [w, f"--reference={ref}", "--nbest=2"],
      USAGE,
      "--reference scores plain translations: drop --nbest and --scores",
    ),
    "translate-topk-without-sampling": (
      [w, f"--input={src}", "--sampling_topk=5"],
      USAGE,
      "--sampling_topk shapes sampling: add --sampling",
    ),
    "translate-topp-out-of-range": (
      [w, "--sampling", "--sampling_topp=1.5"],
      USAGE,
      "--sampling_topp=1.5 must be in (0, 1]",
    ),
    "translate-negative-nbest": ([w, "--nbest=-1"], USAGE, "--nbest=-1 must be >= 0 (0: off)"),
    "translate-not-an-integer": ([w, "--beam_size=four"], USAGE, "flag --beam_size=four"),
    "translate-missing-workdir": (
      [f"--workdir={missing}", f"--input={src}"],
      FAILED,
      "no config.json (not a t2t-train workdir?)",
    ),
    "translate-output-in-no-directory": (
      [w, f"--input={src}", f"--output={missing}/out.txt"],
      FAILED,
      f"--output={missing}/out.txt: cannot write (No such file or directory)",
    ),
  }
  s = {  # t2t-score
    "score-no-source": ([w, f"--target={ref}"], USAGE, "--source is required: the source"),
    "score-checkpoint-typo": (
      [w, f"--source={src}", f"--target={ref}", "--checkpoint=foo"],
      USAGE,
      "--checkpoint=foo: not",
    ),
    "score-batch-tokens-0": (
      [w, f"--source={src}", f"--target={ref}", "--batch_tokens=0"],
      USAGE,
      "--batch_tokens=0 must be >= 1",
    ),
    "score-line-counts": (
      [w, f"--source={src}", f"--target={short}"],
      FAILED,
      f"--source={src} has 3 lines but --target={short} has 2",
    ),
  }
  e = {  # t2t-export
    "export-no-output": ([w], USAGE, "--workdir and --output are required: the trained"),
    "export-unknown-format": (
      [w, f"--output={new}", "--format=onnx"],
      USAGE,
      "flag --format=onnx: value should be one of <ctranslate2|huggingface>",
    ),
    "export-quantized-huggingface": (
      [w, f"--output={new}", "--format=huggingface", "--quantization=int8"],
      USAGE,
      "--quantization=int8 is for --format=ctranslate2",
    ),
    "export-alpha-for-ctranslate2": (
      [w, f"--output={new}", "--alpha=1.1"],
      USAGE,
      "--alpha=1.1 is for --format=huggingface",
    ),
    "export-checkpoint-typo": ([w, f"--output={new}", "--checkpoint=x"], USAGE, "--checkpoint=x:"),
  }
  a = {  # t2t-average
    "average-no-output": ([w], USAGE, "--workdir and --output are required: the trained"),
    "average-num-0": ([w, f"--output={new}", "--num=0"], USAGE, "--num=0 must be >= 1"),
    "average-num-and-checkpoint": (
      [w, f"--output={new}", "--num=3", "--checkpoint=latest"],
      USAGE,
      "give --num or --checkpoint, not both",
    ),
    "average-selected": (
      [w, f"--output={new}", "--checkpoint=selected"],
      USAGE,
      "--checkpoint=selected: t2t-average takes",
    ),
    "average-missing-workdir": (
      [f"--workdir={missing}", f"--output={new}"],
      FAILED,
      f"--workdir={missing} does not exist",
    ),
  }
  b = {  # t2t-bench
    "bench-unknown-part": (["--parts=speed"], USAGE, "--parts=speed: each part is one of peak,"),
    "bench-real-text-flag-alone": (
      ["--parts=train", f"--decode_input={src}"],
      USAGE,
      "--decode_input is for the real-text comparison: add --parts=decode",
    ),
    "bench-positional-argument": (["extra"], USAGE, "unexpected arguments ['extra']"),
    "bench-serve-without-workdir": (
      ["--parts=serve"],
      USAGE,
      "--parts=serve needs --workdir (a trained workdir)",
    ),
    "bench-unknown-experiment": (["--experiment=nope"], USAGE, "unknown experiment"),
  }
  v = {  # t2t-serve
    "serve-no-workdir": ([], USAGE, "--workdir is required"),
    "serve-port-0": ([w, "--port=0"], USAGE, "--port=0 must be in 1..65535"),
    "serve-negative-limit": ([w, "--char_limit=-5"], USAGE, "--char_limit=-5 must be >= 0"),
    "serve-beam-0": ([w, "--beam_size=0"], USAGE, "--beam_size=0 must be >= 1 (1: greedy)"),
    "serve-positional-argument": ([w, "extra"], USAGE, "unexpected arguments ['extra']"),
    "serve-batch-rows-zero": (
      [w, "--batch_rows=0,8"],
      USAGE,
      "--batch_rows=0,8: positive integers, e.g. 1,8",
    ),
    "serve-batch-threads-negative": (
      [w, "--batch_threads=-1"],
      USAGE,
      "--batch_threads=-1 must be >= 0 (0: the backend's default)",
    ),
    "serve-missing-keys-file": (
      [w, f"--api_keys={missing}/keys"],
      FAILED,
      f"--api_keys={missing}/keys: cannot read (No such file or directory)",
    ),
  }
  c = {  # t2t-compare
    "compare-no-reference": ([src, ref], USAGE, "--reference is required"),
    "compare-one-system": (
      [f"--reference={ref}", src],
      USAGE,
      "give a baseline and at least one system",
    ),
    "compare-negative-samples": (
      [f"--reference={ref}", "--samples=-1", src, ref],
      USAGE,
      "--samples=-1 must be >= 0",
    ),
    "compare-missing-system": (
      [f"--reference={ref}", src, f"{missing}/sys.txt"],
      FAILED,
      f"system file {missing}/sys.txt: cannot read (No such file or directory)",
    ),
  }
  x.update(
    {
      "translate-diverse-groups-0": (
        [w, f"--input={src}", "--diverse_groups=0"],
        USAGE,
        "--diverse_groups=0 must be >= 1 (1: off)",
      ),
      "translate-negative-no-repeat": (
        [w, f"--input={src}", "--no_repeat_ngram=-2"],
        USAGE,
        "--no_repeat_ngram=-2 must be >= 0 (0: off)",
      ),
    }
  )
  cases = {}
  for command, table in (
    ("train", t),
    ("prepare", p),
    ("translate", x),
    ("score", s),
    ("export", e),
    ("average", a),
    ("bench", b),
    ("serve", v),
    ("compare", c),
  ):
    cases.update({name: (command, *case) for name, case in table.items()})
  return cases


CASE_NAMES = sorted(_cases("ROOT"))
COMMANDS = (
  "train",
  "prepare",
  "translate",
  "score",
  "export",
  "average",
  "bench",
  "serve",
  "compare",
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  """(root, name -> {status, stderr, created}) of every case and of each command's --help."""
  root = str(tmp_path_factory.mktemp("wrong"))
  out_dir = str(tmp_path_factory.mktemp("wrong_stderr"))
  for name, text in (
    ("src.txt", "1 2\n3\n4 5 6\n"),
    ("ref.txt", "1\n2\n3\n"),
    ("short.txt", "1\n2\n"),
  ):
    with open(f"{root}/{name}", "w") as f:
      f.write(text)
  os.makedirs(f"{root}/good")
  Workdir(f"{root}/good").write_start(small_config())
  cases = [[name, command, args] for name, (command, args, _, _) in _cases(root).items()]
  cases += [[f"{command}-help", command, ["--help"]] for command in COMMANDS]
  cases.append(["train-helpconfig", "train", ["--experiment=tiny", "--helpconfig"]])
  return root, support.forked_commands(cases, root, out_dir)


def test_the_table_covers_every_command_with_at_least_30_cases():
  cases = _cases("ROOT")
  assert len(cases) >= 30
  assert {command for command, *_ in cases.values()} == set(COMMANDS)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_wrong_command_is_one_line_with_its_status_and_creates_nothing(results, name):
  root, got = results
  command, _, status, expected = _cases(root)[name]
  result = got[name]
  lines = [line for line in result["stderr"].splitlines() if line.strip()]
  assert result["status"] == status, result["stderr"]
  assert len(lines) == 1, result["stderr"]  # no log line, no help text, no traceback
  assert lines[0].startswith(f"t2t-{command}: "), lines
  assert expected in lines[0], lines
  assert result["created"] == [], result["created"]  # refused before any work


@pytest.mark.parametrize("command", COMMANDS)
def test_help_exits_0(results, command):
  result = results[1][f"{command}-help"]
  assert result["status"] == 0 and result["created"] == [], result


def test_helpconfig_exits_0(results):
  result = results[1]["train-helpconfig"]
  assert result["status"] == 0 and result["stderr"] == "" and result["created"] == [], result


def _real(command: str, *args: str, cwd: str) -> subprocess.CompletedProcess:
  """The command in a fresh interpreter, with JAX free to look for accelerators."""
  env = dict(os.environ, T2T_HUGE_PAGES="0")
  env.pop("JAX_PLATFORMS", None)
  code = f"import sys; sys.argv[0] = 't2t-{command}'; from t2t_jax.cli.{command} import run; run()"
  return subprocess.run(
    [sys.executable, "-c", code, *args],
    capture_output=True,
    text=True,
    cwd=cwd,
    timeout=300,
    env=env,
  )


def test_in_a_real_process_the_line_comes_before_any_log(tmp_path):
  """A file error is found after the config is loaded and before JAX starts: a fresh
  process prints that one line and no INFO line of JAX or absl."""
  (tmp_path / "a.txt").write_text("1\n2\n")
  (tmp_path / "b.txt").write_text("1\n")
  proc = _real(
    "train",
    f"--workdir={tmp_path}/w",
    "--config.data.source=textfiles",
    f"--config.data.train_source={tmp_path}/a.txt",
    f"--config.data.train_target={tmp_path}/b.txt",
    cwd=str(tmp_path),
  )
  assert proc.returncode == FAILED, proc.stderr
  assert proc.stderr.strip().splitlines() == [
    f"t2t-train: train files are not aligned: {tmp_path}/a.txt has 2 lines but "
    f"{tmp_path}/b.txt has 1 lines"
  ]
  assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.txt"]
