"""Sources: synthetic tasks, the textfiles TFDS builder, and WMT through TFDS with mocked data."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from t2t_jax import data
from t2t_jax.data import sources
from t2t_jax.data.sources import synthetic, textfiles
from tests import support as testing


@pytest.mark.parametrize(
  "task, check",
  [
    ("copy", lambda x, y: y == x),
    ("reverse", lambda x, y: y == x[::-1]),
    ("sort", lambda x, y: y == sorted(x)),
    ("shift", lambda x, y: y == [(v + 1) % 16 for v in x]),
  ],
)
def test_synthetic_tasks(task, check):
  c = data.default_config()
  c.task, c.synthetic_train_size, c.synthetic_min_len, c.synthetic_max_len = task, 50, 3, 9
  pairs = synthetic.pairs(c, "train")
  assert len(pairs) == 50 and pairs == synthetic.pairs(c, "train")  # deterministic
  assert pairs != synthetic.pairs(c, "dev")[:50]
  for source, target in pairs:
    x, y = [int(t) for t in source.split()], [int(t) for t in target.split()]
    assert 3 <= len(x) <= 9 and check(x, y)


def test_synthetic_addition():
  c = data.default_config()
  c.task, c.synthetic_min_len, c.synthetic_max_len = "addition", 1, 5
  for source, target in synthetic.pairs(c, "test"):
    a, b = source.replace(" ", "").split("+")
    assert int(a) + int(b) == int(target.replace(" ", ""))
  assert synthetic.symbols(c) == [str(d) for d in range(10)] + ["+"]


def _write(path, lines):
  path.write_text("".join(l + "\n" for l in lines), encoding="utf-8")


def test_textfiles_builder_keeps_file_order_and_is_prepared_once(tmp_path, monkeypatch):
  lines = [f"Zeile {i} mit Text" for i in range(30)]
  for stem in ("train", "val", "test2016"):
    _write(tmp_path / f"{stem}.en", [l.replace("Zeile", "line") for l in lines])
    _write(tmp_path / f"{stem}.de", lines)
  c = testing.textfiles_config(tmp_path, vocab_size=60, vocab_byte_fallback=False)
  splits = sources.open_splits(c, str(tmp_path / "work"))
  assert len(splits["train"]) == 30
  assert splits["test"].read(range(30)) == [
    (f"line {i} mit Text", f"Zeile {i} mit Text") for i in range(30)
  ]
  # Prepared data is re-used: a second open must not generate again.
  monkeypatch.setattr(
    textfiles.Textfiles, "_split_generators", lambda *a: pytest.fail("prepared twice")
  )
  assert len(sources.open_splits(c, str(tmp_path / "work"))["dev"]) == 30
  # An edited corpus is a different config, prepared afresh (not read stale).
  monkeypatch.undo()
  _write(tmp_path / "train.de", lines[:29] + ["geändert"])
  assert sources.open_splits(c, str(tmp_path / "work"))["train"].read([29])[0][1] == "geändert"


@pytest.mark.parametrize(
  "source, pair, direction, expected, mode",
  [
    ("wmt14_translate", "de-en", ("", ""), ("en", "de"), "bucket"),  # the paper's directions
    ("wmt14_translate", "fr-en", ("", ""), ("en", "fr"), "pack"),
    ("wmt17_translate", "de-en", ("de", "en"), ("de", "en"), "pack"),
  ],
)
def test_wmt_through_tfds_with_mocked_data(tmp_path, source, pair, direction, expected, mode):
  (src_lang, tgt_lang) = expected
  c = data.default_config()
  c.update(
    source=source,
    pair=pair,
    source_lang=direction[0],
    target_lang=direction[1],
    vocab_size=300,
    max_len=64,
    pack_len=64,
    tokens_per_batch=1024,
    batching=mode,
    tfds_data_dir=str(tmp_path / "tfds"),
    download_probe_s=0,  # no network to probe under mock_data
  )
  with tfds.testing.mock_data(num_examples=120):
    d = data.get_datasets(c, str(tmp_path / "work"))
    expected = tfds.data_source(f"{source}/{pair}", split="validation")
    first = {k: v.decode() if isinstance(v, bytes) else v for k, v in expected[0].items()}
  assert d.stats.train.read == 120 and len(d.dev_pairs) == len(d.test_pairs) == 120
  assert d.dev_pairs[0] == (first[src_lang], first[tgt_lang])  # direction as configured
  assert d.tokenizer.vocab_size == 300 and (tmp_path / "work" / "vocab.model").exists()
  it = d.train_iter()
  for _ in range(3):
    batch = next(it)
    assert batch["inputs"].ndim == 3 and np.count_nonzero(batch["targets"]) > 0
  assert sum(1 for _ in d.eval_batches()) > 0


def test_wmt_languages_must_match_pair(tmp_path):
  c = data.default_config()
  c.update(source="wmt14_translate", pair="de-en", source_lang="en", target_lang="fr")
  with pytest.raises(data.DataError, match=r"target_lang='fr'.*pair='de-en'"):
    data.get_datasets(c, str(tmp_path))


def test_wmt_without_download_permission_fails_clearly(tmp_path):
  c = data.default_config()
  c.update(source="wmt14_translate", tfds_data_dir=str(tmp_path), tfds_download=False)
  with pytest.raises(data.DataError, match=r"not prepared.*tfds_download=False"):
    data.get_datasets(c, str(tmp_path))
