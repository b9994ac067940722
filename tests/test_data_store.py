"""The prepared store: same batches and losses as in-memory tokenization, exact resume across
a preparation made by another process, refusal of a mismatching store (per field),
atomic preparation, multi-host waiting, and the text-file reader it prepares from."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.data import prepare, store
from t2t_jax.data.sources import textfiles
from tests import support as data_testing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = (
  "a house",
  "the cat",
  "runs",
  "over",
  "green",
  "small",
  "dogs",
  "sleep",
  "today",
  "ein Haus",
  "die Katze",
  "läuft",
  "über",
  "grün",
  "klein",
  "Hunde",
  "schlafen",
)


def _write(path, lines):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _corpus(directory, n=600, seed=0, long_every=97):
  """Aligned text files (train/val/test2016, en/de) of short made-up sentences, with a few
  empty lines (skipped and counted) and a few long pairs (dropped by max_len)."""
  rng = np.random.default_rng(seed)
  directory.mkdir(parents=True, exist_ok=True)
  for stem, count in (("train", n), ("val", 60), ("test2016", 50)):
    en, de = [], []
    for i in range(count):
      k = 30 if long_every and i % long_every == 0 else int(rng.integers(1, 7))  # a few long
      words = rng.integers(0, 9, k)
      en.append(" ".join(WORDS[w] for w in words) if i % 101 != 5 else "")
      de.append(" ".join(WORDS[9 + w % 8] for w in words))
    _write(directory / f"{stem}.en", en)
    _write(directory / f"{stem}.de", de)
  return directory


def _textfiles_config(corpus, mode="bucket", **overrides):
  fields = dict(
    vocab_size=90,
    vocab_byte_fallback=False,
    max_len=24,
    pack_len=32,
    tokens_per_batch=512,
    batching=mode,
    prefetch_batches=0,
  )
  return data_testing.textfiles_config(corpus, **dict(fields, **overrides))


def _synthetic_config(mode="bucket", **overrides):
  c = data.default_config()
  c.update(
    synthetic_train_size=900,
    synthetic_eval_size=40,
    synthetic_max_len=30,
    max_len=24,
    pack_len=32,
    tokens_per_batch=512,
    batching=mode,
    prefetch_batches=0,
  )
  c.update(overrides)
  return c


def _take(it, n):
  out = [next(it) for _ in range(n)]
  it.close()
  return out


def _same(xs, ys):
  return len(xs) == len(ys) and all(
    x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) and x[k].dtype == y[k].dtype for k in x)
    for x, y in zip(xs, ys)
  )


def _in_memory(c, workdir, **kwargs):
  c = c.copy_and_resolve_references()
  c.prepared_store = False
  return data.get_datasets(c, str(workdir), **kwargs)


# ----------------------------------------------------------------------------- same batches


@pytest.mark.parametrize("mode", ["bucket", "pack"])
@pytest.mark.parametrize("source", ["textfiles", "synthetic"])
def test_store_gives_the_batches_of_in_memory_tokenization(tmp_path, source, mode):
  c = (
    _textfiles_config(_corpus(tmp_path / "corpus"), mode)
    if source == "textfiles"
    else _synthetic_config(mode)
  )
  hosts = dict(process_count=2, num_local_devices=2)
  mem = [_in_memory(c, tmp_path / "mem", process_index=p, **hosts) for p in range(2)]
  kept = [data.get_datasets(c, str(tmp_path / "kept"), process_index=p, **hosts) for p in range(2)]
  assert kept[0].store_path is not None and mem[0].store_path is None
  assert kept[0].stats.train == mem[0].stats.train and kept[0].stats.dev == mem[0].stats.dev
  if source == "textfiles":
    assert mem[0].stats.train.empty_skipped > 0 and mem[0].stats.train.dropped_too_long > 0
  steps = 3 * len(mem[0].train_pairs) // 16  # crosses epoch ends
  for m, k in zip(mem, kept):
    assert _same(_take(m.train_iter(), steps), _take(k.train_iter(), steps))
    assert _same(list(m.eval_batches("dev")), list(k.eval_batches("dev")))
    assert _same(list(m.eval_batches("test")), list(k.eval_batches("test")))
    assert m.dev_pairs == k.dev_pairs and m.test_pairs == k.test_pairs
  assert isinstance(kept[0].train_pairs.inputs_flat, np.memmap)


def _small_train_config(corpus, prepared):
  from t2t_jax.experiments import tiny

  config = tiny.get_config()
  config.model.update(d_model=32, d_ff=64, num_layers=1, max_len=32, dropout_rate=0.1)
  config.data = _textfiles_config(corpus, prepared_store=prepared, max_len=16, bucket_min=16)
  config.update(
    num_train_steps=4,
    warmup_steps=10,
    log_every_steps=1,
    eval_every_steps=4,
    checkpoint_every_steps=2,
    test_at_end=False,
    select_checkpoints="",
  )
  return config


@pytest.mark.slow
def test_training_from_the_store_gives_the_losses_of_in_memory_tokenization(tmp_path):
  from t2t_jax.run.workdir import read_metrics
  from t2t_jax.training import trainer

  corpus = _corpus(tmp_path / "corpus", n=300, long_every=0)  # one eval shape
  for name, prepared in (("mem", False), ("kept", True)):
    trainer.train_and_evaluate(_small_train_config(corpus, prepared), str(tmp_path / name))
  records = {
    name: [
      (r["step"], r.get("loss"), r.get("eval_loss"), r.get("grad_norm"))
      for r in read_metrics(str(tmp_path / name))
      if "loss" in r
    ]
    for name in ("mem", "kept")
  }
  assert len(records["mem"]) == 4 and records["mem"] == records["kept"]
  assert (tmp_path / "kept" / "prepared" / "manifest.json").exists()
  assert not (tmp_path / "mem" / "prepared").exists()


# ----------------------------------------------------------------------------- resume


def _prepare_in_subprocess(workdir, *overrides, tool="prepare"):
  """t2t-prepare (or another tool) in another process, on the tiny experiment."""
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      f"t2t_jax.cli.{tool}",
      "--experiment=tiny",
      f"--workdir={workdir}",
      *overrides,
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  return out


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_exact_resume_across_a_preparation_made_by_another_process(tmp_path, mode):
  from t2t_jax.experiments import tiny

  overrides = [
    "--config.data.synthetic_train_size=3000",
    f"--config.data.batching={mode}",
    "--config.data.tokens_per_batch=256",
    "--config.data.prefetch_batches=0",
  ]
  out = _prepare_in_subprocess(tmp_path / "w", *overrides)
  assert out.returncode == 0, out.stderr
  assert "prepared data:" in out.stdout and "3000 pairs read" in out.stdout
  c = tiny.get_config().data
  c.update(synthetic_train_size=3000, batching=mode, tokens_per_batch=256, prefetch_batches=0)
  uninterrupted = _take(_in_memory(c, tmp_path / "mem").train_iter(), 40)
  it = data.get_datasets(c, str(tmp_path / "w")).train_iter()
  first = _take_keep(it, 25)
  state = json.loads(json.dumps(it.get_state()))  # as a checkpoint stores it
  it.close()
  # The store is made again by yet another process (a new host, a lost disk): same arrays.
  shutil.rmtree(tmp_path / "w" / "prepared")
  assert _prepare_in_subprocess(tmp_path / "w", *overrides).returncode == 0
  resumed = data.get_datasets(c, str(tmp_path / "w")).train_iter()
  resumed.set_state(state)
  assert _same(first + _take(resumed, 15), uninterrupted)


def _take_keep(it, n):
  return [next(it) for _ in range(n)]


# ----------------------------------------------------------------------------- refusal


@pytest.mark.slow
def test_both_commands_refuse_a_mismatching_store_in_one_line(tmp_path):
  assert _prepare_in_subprocess(tmp_path, "--config.data.synthetic_train_size=500").returncode == 0
  for tool in ("prepare", "train"):
    out = _prepare_in_subprocess(
      tmp_path, "--config.data.synthetic_train_size=500", "--config.data.max_len=12", tool=tool
    )
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert last.startswith(f"t2t-{tool}: {tmp_path}/prepared: prepared for config.data.max_len=16")
    assert "but this run has 12" in last


def _prepared_textfiles(tmp_path):
  c = _textfiles_config(_corpus(tmp_path / "corpus"))
  data.get_datasets(c, str(tmp_path / "w"))
  return c


@pytest.mark.parametrize(
  "field, value", [("max_len", 20), ("train_max_pairs", 100), ("source", "synthetic")]
)
def test_a_store_for_another_config_is_refused_naming_the_field(tmp_path, field, value):
  c = _prepared_textfiles(tmp_path)
  c[field] = value
  with pytest.raises(
    data.DataError,
    match=rf"prepared for config\.data\.{field}=.*but this "
    rf"run has {value!r}.*delete .*prepared",
  ):
    data.get_datasets(c, str(tmp_path / "w"))


@pytest.mark.parametrize(
  "field, value", [("task", "copy"), ("synthetic_seed", 3), ("synthetic_train_size", 901)]
)
def test_a_synthetic_store_is_refused_for_another_task(tmp_path, field, value):
  data.get_datasets(_synthetic_config(), str(tmp_path))
  with pytest.raises(data.DataError, match=rf"config\.data\.{field}="):
    data.get_datasets(_synthetic_config(**{field: value}), str(tmp_path))


def test_an_edited_corpus_is_refused_a_moved_one_accepted(tmp_path):
  c = _prepared_textfiles(tmp_path)
  moved = tmp_path / "moved"
  shutil.copytree(tmp_path / "corpus", moved)
  c2 = _textfiles_config(moved)
  assert data.get_datasets(c2, str(tmp_path / "w")).stats.train.read == 600  # same content
  lines = (moved / "train.de").read_text(encoding="utf-8").split("\n")
  lines[3] = lines[3][::-1]  # same size, other content
  (moved / "train.de").write_text("\n".join(lines), encoding="utf-8")
  with pytest.raises(
    data.DataError,
    match=r"config\.data\.train_target=.*moved/train\.de .*is "
    r"not the file the data was prepared from .*corpus/train\.de",
  ):
    data.get_datasets(c2, str(tmp_path / "w"))
  without_test = c.copy_and_resolve_references()
  without_test.test_source = without_test.test_target = ""
  with pytest.raises(
    data.DataError,
    match=r"config\.data\.test_source=.*test2016\.en.*but "
    "this run has ''",
  ):
    data.get_datasets(without_test, str(tmp_path / "w"))
  with open(tmp_path / "corpus" / "val.en", "a", encoding="utf-8") as f:
    f.write("one more line\n")
  with pytest.raises(data.DataError, match=r"config\.data\.dev_source=.*val\.en"):
    data.get_datasets(c, str(tmp_path / "w"))


def test_another_vocabulary_a_damaged_store_and_an_old_format_are_refused(tmp_path):
  c = _prepared_textfiles(tmp_path)
  w = tmp_path / "w"
  vocab = (w / "vocab.model").read_bytes()
  _corpus(tmp_path / "other", seed=1)
  data.load_or_train_tokenizer(_textfiles_config(tmp_path / "other"), str(tmp_path / "v2"))
  shutil.copy(tmp_path / "v2" / "vocab.model", w / "vocab.model")
  with pytest.raises(data.DataError, match=r"prepared with a vocabulary of sha256 .*vocab\.model"):
    data.get_datasets(c, str(w))
  (w / "vocab.model").unlink()
  with pytest.raises(data.DataError, match=r"vocab\.model, which is missing"):
    data.get_datasets(c, str(w))
  (w / "vocab.model").write_bytes(vocab)
  array = w / "prepared" / "train.targets.npy"
  full = array.read_bytes()
  array.write_bytes(full[:-2])
  with pytest.raises(
    data.DataError,
    match=r"train\.targets\.npy: \d+ bytes where the manifest "
    r"says \d+: the store is damaged",
  ):
    data.get_datasets(c, str(w))
  array.write_bytes(full)
  manifest = json.loads((w / "prepared" / "manifest.json").read_text())
  (w / "prepared" / "manifest.json").write_text(json.dumps(dict(manifest, format_version=0)))
  with pytest.raises(data.DataError, match=r"store format 0, this t2t_jax reads format 1"):
    data.get_datasets(c, str(w))


# ----------------------------------------------------------------------------- atomicity


def test_an_interrupted_preparation_leaves_no_store_and_is_redone(tmp_path, monkeypatch):
  c = _textfiles_config(_corpus(tmp_path / "corpus"))
  w = tmp_path / "w"
  real = store.SplitWriter.close

  def crash(self):
    raise KeyboardInterrupt  # the process is stopped while writing dev

  monkeypatch.setattr(
    store.SplitWriter,
    "close",
    lambda self: crash(self) if self._tokens[0].path.name.startswith("dev") else real(self),
  )
  with pytest.raises(KeyboardInterrupt):
    data.get_datasets(c, str(w))
  # no store, no temporary; the lock file stays for the next preparer
  assert sorted(p.name for p in w.iterdir()) == ["prepared.lock", "vocab.model"]
  monkeypatch.undo()
  # Stopped while writing the manifest (the last file before the rename): nothing published.
  monkeypatch.setattr(store, "write_manifest", lambda *a: crash(None))
  with pytest.raises(KeyboardInterrupt):
    data.get_datasets(c, str(w))
  assert sorted(p.name for p in w.iterdir()) == ["prepared.lock", "vocab.model"]
  c1 = c.copy_and_resolve_references()
  c1.wait_for_process0_s = 0.2
  with pytest.raises(
    data.DataError,
    match=r"waiting for process 0 to write .*prepared/"
    r"manifest\.json",
  ):
    data.get_datasets(c1, str(w), process_index=1, process_count=2)
  monkeypatch.undo()
  d = data.get_datasets(c, str(w))
  assert d.stats.train.read == 600 and store.read_manifest(w / "prepared") is not None


# ----------------------------------------------------------------------------- sharing


def test_other_hosts_and_other_workdirs_use_process_0s_store(tmp_path, monkeypatch):
  c = _textfiles_config(_corpus(tmp_path / "corpus"), data_dir=str(tmp_path / "shared"))
  d0 = data.get_datasets(c, str(tmp_path / "run1"), process_index=0, process_count=2)
  assert d0.store_path == tmp_path / "shared" / "prepared"
  assert (tmp_path / "shared" / "vocab.model").exists()
  assert not (tmp_path / "run1" / "vocab.model").exists()
  monkeypatch.setattr(prepare, "prepare", lambda *a: pytest.fail("prepared twice"))
  d1 = data.get_datasets(c, str(tmp_path / "run2"), process_index=1, process_count=2)
  other_run = data.get_datasets(c, str(tmp_path / "run3"), process_index=0, process_count=2)
  assert _same(_take(d0.train_iter(), 5), _take(other_run.train_iter(), 5))
  assert d1.stats.train == d0.stats.train
  assert data.vocab_path(c, str(tmp_path / "run2")) == tmp_path / "shared" / "vocab.model"


# ----------------------------------------------------------------------------- text files

TRICKY = [
  b"",
  b"\n",
  b"a\nb",
  b"a\r\nb\r\n",
  b"\xef\xbb\xbf",
  b"\xef\xbb\xbfx\n\n",
  "one\rline\u2028still one\n\n  \nlast".encode(),
  "ä\nö\nü\n".encode() * 50,
]


def _reference_lines(content: bytes) -> list[str]:
  """The line rules spelled out on the whole text: only '\\n' ends a line, a leading BOM
  and one trailing '\\r' per line are dropped, a final newline starts no line."""
  lines = content.decode("utf-8").removeprefix("\ufeff").split("\n")
  if lines[-1] == "":
    lines.pop()
  return [line.removesuffix("\r") for line in lines]


@pytest.mark.parametrize("content", TRICKY)
def test_line_files_read_what_the_line_rules_say(tmp_path, monkeypatch, content):
  monkeypatch.setattr(textfiles, "_BLOCK", 7)  # many block boundaries, inside characters too
  path = tmp_path / "f.txt"
  path.write_bytes(content)
  expected = _reference_lines(content)
  assert textfiles.read_lines(str(path)) == expected
  f = textfiles.LineFile(str(path))
  assert f.lines(range(len(f))) == expected  # contiguous read
  assert f.lines(list(range(len(f)))[::-1]) == expected[::-1]  # by index
  assert f.sha256 == store.sha256_file(path) and f.size == len(content)


def test_line_files_report_bad_input_naming_file_line_and_flag(tmp_path, monkeypatch):
  monkeypatch.setattr(textfiles, "_BLOCK", 8)
  bad = tmp_path / "bad.de"
  bad.write_bytes("gut\nnoch gut\nschl\xe4cht".encode("latin-1") + b"\nrest\n")
  with pytest.raises(data.DataError) as expected:
    textfiles.read_lines(str(bad), "train_target")
  with pytest.raises(data.DataError) as got:
    textfiles.LineFile(str(bad), "train_target")
  assert str(got.value) == str(expected.value).replace(str(bad), os.path.abspath(bad))
  assert ":3: bytes that are not UTF-8 at byte 5 of the line" in str(got.value)
  assert str(got.value).endswith("(config.data.train_target)")
  good = tmp_path / "good.en"
  _write(good, ["a", "b"])
  _write(tmp_path / "three.de", ["a", "b", "c"])
  with pytest.raises(
    data.DataError,
    match=r"train files are not aligned: .*good\.en has 2 "
    r"lines but .*three\.de has 3 lines",
  ):
    textfiles.AlignedFiles(str(good), str(tmp_path / "three.de"), "train")
  with pytest.raises(
    data.DataError,
    match=r"missing\.en: no such file \(config\.data\."
    r"train_source\)",
  ):
    textfiles.AlignedFiles(str(tmp_path / "missing.en"), str(good), "train")
