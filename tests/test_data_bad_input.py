"""Bad input fails before training, naming files, lines and flags; empty lines are counted."""

import pytest

from t2t_jax import data
from t2t_jax.data.sources import textfiles
from tests import support as testing


def _write(path, lines, raw: bytes | None = None):
  path.write_bytes(raw if raw is not None else "".join(l + "\n" for l in lines).encode())
  return str(path)


def _corpus(tmp_path, n=40):
  src = [f"source sentence number {i} here" for i in range(n)]
  tgt = [f"Zielsatz Nummer {i} hier" for i in range(n)]
  for stem in ("train", "val"):
    _write(tmp_path / f"{stem}.en", src)
    _write(tmp_path / f"{stem}.de", tgt)
  return testing.textfiles_config(
    tmp_path,
    test="",
    vocab_size=100,
    vocab_byte_fallback=False,
    max_len=32,
    pack_len=32,
    tokens_per_batch=256,
  )


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
  c = _corpus(tmp_path)
  _write(tmp_path / "train.de", ["only", "three", "lines"])
  with pytest.raises(data.DataError) as e:
    data.get_datasets(c, str(tmp_path / "work"))
  message = str(e.value)
  assert c.train_source in message and c.train_target in message
  assert "40 lines" in message and "3 lines" in message
  assert not (tmp_path / "work" / "vocab.model").exists()  # failed before any training


def test_missing_file_names_file_and_flag(tmp_path):
  c = _corpus(tmp_path)
  c.dev_target = str(tmp_path / "nope.de")
  with pytest.raises(data.DataError, match=r"nope\.de: no such file.*config\.data\.dev_target"):
    data.get_datasets(c, str(tmp_path / "work"))


def test_unreadable_file_names_file(tmp_path):
  (tmp_path / "adir").mkdir()
  with pytest.raises(data.DataError, match=r"adir: cannot read"):
    textfiles.read_lines(str(tmp_path / "adir"), "train_source")
  c = _corpus(tmp_path)
  c.train_source = str(tmp_path / "adir")
  with pytest.raises(data.DataError, match=r"adir: cannot read.*config\.data\.train_source"):
    data.get_datasets(c, str(tmp_path / "work"))


def test_non_utf8_names_file_and_line(tmp_path):
  c = _corpus(tmp_path)
  lines = [f"Satz {i}".encode() for i in range(40)]
  lines[6] = b"kaputt \xff\xfe bytes"
  _write(tmp_path / "train.de", None, raw=b"\n".join(lines) + b"\n")
  with pytest.raises(data.DataError, match=r"train\.de:7: bytes that are not UTF-8"):
    data.get_datasets(c, str(tmp_path / "work"))


def test_line_endings_cr_inside_a_line_does_not_split(tmp_path):
  path = _write(tmp_path / "x.txt", None, raw=b"\xef\xbb\xbfa\r\nb\rc\nd\xe2\x80\xa8e\nlast")
  assert textfiles.read_lines(path) == ["a", "b\rc", "d\u2028e", "last"]


def test_empty_lines_skipped_counted_and_alignment_kept(tmp_path):
  c = _corpus(tmp_path)
  src = [f"source {i}" for i in range(40)]
  tgt = [f"target {i}" for i in range(40)]
  src[3], tgt[10], src[20], tgt[20] = "", "   ", "", ""
  for stem in ("train", "val"):
    _write(tmp_path / f"{stem}.en", src)
    _write(tmp_path / f"{stem}.de", tgt)
  d = data.get_datasets(c, str(tmp_path / "work"))
  assert (d.stats.train.read, d.stats.train.empty_skipped, d.stats.train.kept) == (40, 3, 37)
  assert (d.stats.dev.read, d.stats.dev.empty_skipped) == (40, 3)
  assert all(s.split()[1] == t.split()[1] for s, t in d.dev_pairs)  # still aligned
  assert [int(s.split()[1]) for s, _ in d.dev_pairs] == [
    i for i in range(40) if i not in (3, 10, 20)
  ]
  for i in range(len(d.train_pairs)):
    pair = d.train_pairs.pair(i)
    assert (
      d.tokenizer.decode(pair["inputs"]).split()[1]
      == (d.tokenizer.decode(pair["targets"]).split()[1])
    )
  assert "3 empty skipped" in d.stats.summary()


def test_bad_config_names_the_flag(tmp_path):
  c = data.default_config()
  c.batching = "sorted"
  with pytest.raises(data.DataError, match=r"config\.data\.batching='sorted'"):
    data.get_datasets(c, str(tmp_path))
  c = data.default_config()
  c.tokens_per_batch = 100
  with pytest.raises(data.DataError, match=r"tokens_per_batch=100.*raise tokens_per_batch"):
    data.get_datasets(c, str(tmp_path))
  c = data.default_config()
  c.batching, c.pack_len, c.max_len = "pack", 64, 128
  with pytest.raises(data.DataError, match=r"pack_len=64 must be >= max_len=128"):
    data.get_datasets(c, str(tmp_path))


def test_other_processes_wait_for_process_0_and_give_up_clearly(tmp_path):
  c = _corpus(tmp_path)
  c.wait_for_process0_s = 0.2
  with pytest.raises(data.DataError, match=r"waiting for process 0 .*must be shared"):
    data.get_datasets(c, str(tmp_path / "work"), process_index=1, process_count=2)
  data.get_datasets(c, str(tmp_path / "work"), process_index=0, process_count=2)
  host1 = data.get_datasets(c, str(tmp_path / "work"), process_index=1, process_count=2)
  assert host1.stats.train.kept == 40  # process 0's prepared data and vocabulary
