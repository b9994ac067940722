"""t2t-bench --vs=ctranslate2 --workdir: t2t_jax against its CTranslate2 exports on a text
file, in t2t-translate's batches (bench.real_text)."""

import contextlib
import io
import json
import os
import sys
import time

import pytest

from t2t_jax.bench import real_text
from t2t_jax.bench.timing import CompileCounter
from t2t_jax.cli import bench, common
from t2t_jax.decoding.translator import default_batch_threads
from tests import export_support, support

LINES = 8


@pytest.fixture
def bench_main(monkeypatch):
  """t2t-bench's main() on argv, its global flags reset afterwards."""
  if "config" not in bench.FLAGS:
    monkeypatch.setattr(sys, "argv", ["t2t-bench"])
    common.define_config_flag("t2t-bench")

  def run(*args):
    argv = ["t2t-bench", "--experiment=tiny", *args]
    try:
      bench.main(bench.FLAGS(argv))  # main gets what flag parsing leaves, as from app.run
    finally:
      bench.FLAGS.unparse_flags()

  return run


@pytest.mark.parametrize(
  "args, message",
  [
    (["--decode_input=x.en"], "--decode_input is for the real-text comparison"),
    (["--parts=decode", "--cold"], "--cold is for the real-text comparison"),
    (
      ["--parts=decode", "--vs=ctranslate2", "--workdir=W", "--decode_batch_tokens=0"],
      "--decode_batch_tokens=0 must be >= 1",
    ),
    (
      ["--parts=decode", "--vs=ctranslate2", "--workdir=W", "--decode_sentences=-1"],
      "--decode_sentences=-1 must be >= 0",
    ),
    (
      ["--parts=decode", "--vs=ctranslate2", "--workdir=/nonexistent/w"],
      "/nonexistent/w: no config.json",
    ),
    (["--parts=decode", "--decode_dtypes=bfloat16"], "--decode_dtypes is for the real-text"),
    (
      ["--parts=decode", "--vs=ctranslate2", "--workdir=W", "--decode_dtypes=float32,half"],
      "--decode_dtypes=float32,half: each is one of auto, float32, bfloat16",
    ),
  ],
)
def test_bad_real_text_flags_are_one_line_naming_the_flag(bench_main, args, message):
  with pytest.raises(SystemExit) as e:
    bench_main(*args)
  assert str(e.value).startswith("t2t-bench: ") and message in str(e.value)
  assert "\n" not in str(e.value)


def test_text_and_reference_are_read_and_checked(tmp_path):
  source, reference = tmp_path / "in.en", tmp_path / "ref.de"
  source.write_text("a\nb\nc\n")
  reference.write_text("x\ny\n")
  text = real_text.read_text(str(source), str(reference), 2)
  assert (text.lines, text.references, text.origin) == (["a", "b"], ["x", "y"], str(source))
  assert real_text.read_text(str(source), None, 0).lines == ["a", "b", "c"]
  with pytest.raises(real_text.TextError, match=r"^--decode_reference=.*: 2 lines for 3"):
    real_text.read_text(str(source), str(reference), 0)
  with pytest.raises(real_text.TextError, match=r"^--decode_input=.*missing.en"):
    real_text.read_text(str(tmp_path / "missing.en"), None, 0)

  (tmp_path / "latin1.en").write_bytes(b"ok\ncaf\xe9\n")
  with pytest.raises(real_text.TextError, match=r"^--decode_input=.*latin1.en:2: not UTF-8"):
    real_text.read_text(str(tmp_path / "latin1.en"), None, 0)


def test_cold_processes_call_what_the_console_script_calls():
  from t2t_jax.cli import host

  code = real_text.console_script_code("t2t-translate")
  assert code == "import t2t_jax.cli.host as tool; tool.translate()"
  assert callable(host.translate)
  with pytest.raises(RuntimeError, match="no console script t2t-nonexistent installed"):
    real_text.console_script_code("t2t-nonexistent")


def test_the_shared_test_set_brings_its_own_reference(tmp_path, monkeypatch):
  (tmp_path / "multi30k").mkdir()
  (tmp_path / "multi30k" / "test2016.en").write_text("a\nb\n")
  monkeypatch.setenv("T2T_SHARED_DATA", str(tmp_path))
  assert real_text.read_text(None, None, 0, "multi30k").references is None
  (tmp_path / "multi30k" / "test2016.de").write_text("x\ny\n")
  text = real_text.read_text(None, None, 1, "multi30k")
  assert (text.lines, text.references) == (["a"], ["x"])
  assert text.origin == str(tmp_path / "multi30k" / "test2016.en")
  monkeypatch.setenv("T2T_SHARED_DATA", str(tmp_path / "none"))
  with pytest.raises(real_text.TextError, match="^--decode_input: no file given"):
    real_text.read_text(None, None, 0)


def test_compile_counter_sums_compile_seconds():
  import jax
  import jax.numpy as jnp

  x = jnp.arange(7.0).block_until_ready()
  counter = CompileCounter()
  before = counter.snapshot()
  # A constant of its own, so that no persistent compilation cache holds the program.
  jax.jit(lambda x: x * float(time.time_ns() % 1_000_003) + 1)(x).block_until_ready()
  count, seconds = (now - then for now, then in zip(counter.snapshot(), before))
  assert count == 1 and seconds > 0


def test_ms_per_hypothesis_step_divides_each_pass_by_the_steps_it_ran():
  """t2t_jax's steps are those its search ran (its statistics), not those its outputs
  needed; another system's are its own row's."""
  search = {"hypothesis_steps_run": 8000, "hypothesis_steps_needed": 5000}
  assert real_text.ms_per_hypothesis_step({"median_s": 2.0}, search) == pytest.approx(0.25)
  other = {"median_s": 3.0, "hypothesis_steps": 6000}
  assert real_text.ms_per_hypothesis_step(other, search) == pytest.approx(0.5)
  assert real_text.ms_per_hypothesis_step({"median_s": 1.0, "hypothesis_steps": 0}, search) is None


@pytest.fixture(scope="module")
def text_files():
  """(workdir, source file, reference file): the shared SentencePiece workdir and its test
  split."""
  pytest.importorskip("ctranslate2")
  corpus = export_support._text_corpus()
  source, reference = (os.path.join(corpus, f"test2016.{lang}") for lang in ("en", "de"))
  return export_support.text_workdir(), source, reference


@pytest.fixture(scope="module")
def comparison(text_files, tmp_path_factory):
  """(the JSON's decode_text, the printed text) of t2t-bench on LINES lines of the text."""
  workdir, source, reference = text_files
  out = tmp_path_factory.mktemp("bench") / "bench.json"
  argv = [
    "t2t-bench",
    "--experiment=tiny",
    "--parts=decode",
    "--vs=ctranslate2",
    f"--workdir={workdir}",
    f"--decode_input={source}",
    f"--decode_reference={reference}",
    f"--decode_sentences={LINES}",
    "--decode_batch_tokens=64",
    "--repeats=1",
    "--decode_dtypes=float32,bfloat16",
    f"--json={out}",
  ]
  saved = sys.argv
  try:
    sys.argv = ["t2t-bench"]
    if "config" not in bench.FLAGS:
      common.define_config_flag("t2t-bench")
    printed = io.StringIO()
    remaining = bench.FLAGS(argv)
    with contextlib.redirect_stdout(printed):
      bench.main(remaining)
  finally:
    bench.FLAGS.unparse_flags()
    sys.argv = saved
  return json.loads(out.read_text())["decode_text"], printed.getvalue()


@pytest.mark.slow  # trains the shared SentencePiece workdir when no earlier test did
def test_every_system_translates_the_text_in_both_searches(comparison):
  result, _ = comparison
  assert result["sentences"] == LINES and result["reference"]
  assert list(result["searches"]) == ["beam", "greedy"]
  for name, search in result["searches"].items():
    systems = search["systems"]
    # with two cores or more, CTranslate2 also translates two batches at once, and t2t_jax
    # (two at once there) also one at a time
    ct2 = [f"ctranslate2 {c}" for c in ("float32", "int8")]
    one = []
    if result["threads"] >= 2:
      ct2 = [n for c in ct2 for n in (c, f"{c}, 2 batches at once")]
      one = ["t2t_jax float32, one batch at a time"]
    assert list(systems) == ["t2t_jax", "t2t_jax bfloat16", *one, *ct2]
    assert systems["t2t_jax"]["batch_threads"] == default_batch_threads()
    for system in one:  # the same batches through the same programs, one after another
      assert systems[system]["batch_threads"] == 1
      assert systems[system]["same_as_t2t_jax"] == LINES
      assert systems[system]["first_pass_compiles"] == 0
      assert systems[system]["hypothesis_steps"] == search["t2t_jax"]["hypothesis_steps_run"]
    assert systems["t2t_jax"]["dtype"] == "float32"
    assert systems["t2t_jax bfloat16"]["dtype"] == "bfloat16"
    # Its own programs (another dtype), its own search statistics.
    assert systems["t2t_jax bfloat16"]["first_pass_compiles"] >= 1
    assert systems["t2t_jax bfloat16"]["hypothesis_steps"] >= search["beam_size"] * LINES
    for system, row in systems.items():
      assert 0 <= row["same_as_t2t_jax"] <= LINES, (name, system)
      assert row["bleu"] is not None and row["output_tokens"] >= LINES, (name, system)
      assert row["sentences_per_s"] > 0 and row["setup_s"] > 0 and len(row["seconds"]) == 1
      steps = row.get("hypothesis_steps", search["t2t_jax"]["hypothesis_steps_run"])
      assert row["ms_per_hypothesis_step"] == pytest.approx(1e3 * row["median_s"] / steps)
    assert systems["t2t_jax"]["same_as_t2t_jax"] == LINES
    for system in ct2:
      assert (
        systems[system]["hypothesis_steps"]
        == search["beam_size"] * (systems[system]["output_tokens"])
      )
  # Greedy search has no length penalty: the float32 export gives t2t_jax's outputs but where
  # two tokens are within float32 noise of each other, which a briefly trained model (flat
  # distributions) meets more often; a wrong export matches hardly any line.
  greedy = result["searches"]["greedy"]["systems"]
  assert greedy["ctranslate2 float32"]["same_as_t2t_jax"] >= LINES // 2


@pytest.mark.slow
def test_the_search_statistics_count_one_pass(comparison):
  result, printed = comparison
  for search in result["searches"].values():
    stats, beam = search["t2t_jax"], search["beam_size"]
    assert stats["sentences"] == LINES and stats["rows"] >= LINES and stats["batches"] >= 1
    assert stats["padding_rows"] == stats["rows"] - LINES
    assert stats["hypothesis_steps_run"] >= stats["hypothesis_steps_needed"] > 0
    assert stats["hypothesis_steps_needed"] % beam == 0
    # The output tokens are the steps the outputs needed, EOS included.
    assert stats["hypothesis_steps_needed"] == beam * search["systems"]["t2t_jax"]["output_tokens"]
    assert stats["stages"] >= stats["batches"] and stats["timed_compiles"] == 0
  for line in (
    "| t2t_jax float32 |",
    "| t2t_jax bfloat16 |",
    "| ctranslate2 int8 |",
    "hypothesis-steps | ms per hypothesis-step |",
    "beam search, beam 4",
    "greedy search, beam 1",
  ):
    assert line in printed, printed


@pytest.mark.slow  # two t2t-translate processes, each compiling its search
def test_cold_processes_time_each_command_end_to_end(text_files, tmp_path):
  from t2t_jax.export import load_trained, to_ctranslate2

  workdir, source, _ = text_files
  path = to_ctranslate2.export(load_trained(workdir), str(tmp_path / "ct2"))
  lines = real_text.read_text(source, None, 2).lines
  cold = real_text.cold_processes(
    workdir,
    lines,
    {"float32": path},
    beam_size=1,
    alpha=0.6,
    batch_tokens=4096,
    max_decoding_length=60,
    threads=1,
    env=support.cpu_env(devices=1),
  )
  assert cold["sentences"] == 2 and cold["cache_files"] >= 0
  for key in ("t2t_translate_fresh_cache_s", "t2t_translate_warm_cache_s", "ctranslate2_float32_s"):
    assert cold[key] > 0, cold
  assert set(cold["first_line"]) == {"t2t_translate_warm_cache_s", "ctranslate2_float32_s"}
  assert all(seconds > 0 for seconds in cold["first_line"].values())
  printed = "\n".join(real_text._cold_lines(cold))
  assert "| CTranslate2 float32, load + translate |" in printed
  assert "| t2t-translate of the first line alone, its programs cached (start-up) |" in printed


def test_compile_seconds_count_overlapping_compilations_once():
  """Two batches compiling at once (0-2 s and 1-3 s) are 3 s of compiling, not 4; one
  reported after a longer one that covered it adds no second; every one is counted."""
  counter = CompileCounter()
  for start, end in [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.8)]:
    counter.add(start, end)
  assert counter.snapshot() == (4, 4.0)


@pytest.mark.parametrize("threads", [1, 2])
def test_t2t_jax_also_decodes_one_batch_at_a_time_where_it_decodes_two(threads):
  workdir = support.small_trained_workdir()
  systems, load_s = real_text.t2t_systems(workdir, "auto", ["float32"], 64, "heuristic", threads)
  first = systems["t2t_jax"]
  assert first.batch_threads == default_batch_threads() == 2 and load_s > 0
  assert first.search.beam_stop == "heuristic"
  names = ["t2t_jax", "t2t_jax float32, one batch at a time"]
  assert list(systems) == names[: 1 if threads == 1 else 2]
  for one in list(systems.values())[1:]:
    assert one.batch_threads == 1 and one.search == first.search
    assert one.batch_tokens == 64 and one.model.config.dtype == first.model.config.dtype
