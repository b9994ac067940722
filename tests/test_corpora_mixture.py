"""Several weighted training corpora (config.data.train_corpora) and the length-ratio filter:
shares, determinism, exact resume, tags, the filter's count, and each bad input's message."""

import json
import pathlib
import shutil

import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.data import mixture, tokenized
from tests import support

WORDS = [
  "the",
  "cat",
  "sat",
  "on",
  "a",
  "mat",
  "dog",
  "ran",
  "far",
  "der",
  "die",
  "das",
  "hund",
  "katze",
  "lief",
  "weit",
]
TAG = "<bt>"


def _write(directory: pathlib.Path, stem: str, n: int, seed: int, stretch_every: int = 0):
  """`<stem>.en`/`<stem>.de` of n short made-up pairs; with stretch_every, every such pair's
  target repeats each word six times (beyond a small length ratio)."""
  rng = np.random.default_rng(seed)
  en, de = [], []
  for i in range(n):
    words = rng.integers(0, 9, int(rng.integers(1, 6)))
    reps = 6 if stretch_every and i % stretch_every == 0 else 1
    en.append(" ".join(WORDS[w] for w in words))
    de.append(" ".join(WORDS[9 + w % 7] for w in words for _ in range(reps)))
  for lang, lines in (("en", en), ("de", de)):
    (directory / f"{stem}.{lang}").write_text("".join(line + "\n" for line in lines))
  return str(directory / f"{stem}.en"), str(directory / f"{stem}.de")


def _config(directory: pathlib.Path, weights=(1.0, 2.5), tags=("", TAG), **overrides):
  """Two corpora: 300 pairs and 100 pairs."""
  directory.mkdir(parents=True, exist_ok=True)
  files = [_write(directory, "a", 300, 0), _write(directory, "b", 100, 1)]
  c = support.textfiles_config(
    directory,
    train="",
    dev="",
    test="",
    vocab_size=60,
    vocab_byte_fallback=False,
    max_len=40,
    pack_len=40,
    tokens_per_batch=256,
    prefetch_batches=0,
    bucket_boundaries=(8, 16),
  )
  c.train_corpora = tuple(
    dict(source=src, target=tgt, weight=w, **({"tag": t} if t else {}))
    for (src, tgt), w, t in zip(files, weights, tags)
  )
  c.update(overrides)
  return c


def _first_tokens(batch):
  """[rows] first source token of each row holding a pair (pad rows left out)."""
  first = batch["inputs"].reshape(-1, batch["inputs"].shape[-1])[:, 0]
  return first[first > 0]


def _equal(x, y):
  return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def test_empirical_shares_match_the_weights(tmp_path):
  d = data.get_datasets(_config(tmp_path / "c"), str(tmp_path / "w"))
  kept = [k.kept for k in d.corpus_counts]
  expected = 2.5 * kept[1] / (kept[0] + 2.5 * kept[1])  # upsampling factors 1 and 2.5
  tag = d.tokenizer.piece_id(TAG)
  it = d.train_iter()
  first = np.concatenate([_first_tokens(next(it)) for _ in range(4 * int(d.steps_per_epoch))])
  assert abs(np.mean(first == tag) - expected) < 0.03
  assert f"{100 * expected:.1f}% of pairs" in d.stats.summary()
  # Over whole epochs the stream holds corpus b's pairs 2 or 3 times each, a's once.
  counts = np.bincount(d.bucket_plan.sample, minlength=len(d.train_pairs))
  assert set(counts[: kept[0]]) == {1} and set(counts[kept[0] :]) == {2, 3}
  assert np.sum(counts[kept[0] :] == 3) == round(0.5 * kept[1])


def test_upsampling_sample_is_the_documented_multiset():
  got = mixture.sample([4, 10], [2, 0.3], seed=7)
  extra = 4 + np.sort(np.random.default_rng([7, 1]).choice(10, 3, replace=False))
  assert np.array_equal(got, np.concatenate([np.arange(4), np.arange(4), extra]))
  assert mixture.sample([4, 10], [1, 1], seed=7) is None


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_mixture_is_deterministic_and_resumes_exactly(tmp_path, mode):
  c = _config(tmp_path / "c", batching=mode)
  d = data.get_datasets(c, str(tmp_path / "w1"))
  steps = int(2.5 * (d.steps_per_epoch or 30))  # crosses an epoch end
  it = d.train_iter()
  uninterrupted = [next(it) for _ in range(steps)]
  other_run = data.get_datasets(c, str(tmp_path / "w2")).train_iter()  # prepared again
  assert all(_equal(x, next(other_run)) for x in uninterrupted)
  it = d.train_iter()
  for _ in range(steps // 2):
    next(it)
  state = json.loads(json.dumps(it.get_state()))  # as a checkpoint stores it
  it.close()
  restarted = data.get_datasets(c, str(tmp_path / "w1")).train_iter()  # from the store
  restarted.set_state(state)
  assert all(_equal(x, next(restarted)) for x in uninterrupted[steps // 2 :])


def test_tag_is_the_first_source_token_of_its_corpus_only(tmp_path):
  c = _config(tmp_path / "c", weights=(1.0, 1.0))
  d = data.get_datasets(c, str(tmp_path / "w"))
  tag = d.tokenizer.piece_id(TAG)
  assert d.tokenizer.id_to_piece(tag) == TAG and tag >= 4  # a piece, not a reserved id
  first = d.corpus_counts[0].kept
  sources = [d.train_pairs.pair(i)["inputs"] for i in range(len(d.train_pairs))]
  assert all(tag not in s for s in sources[:first])
  assert all(s[0] == tag and tag not in s[1:] for s in sources[first:])
  assert len(sources) - first == 100
  # Tokenizing into memory at every start gives the stored pairs.
  c.prepared_store = False
  memory = data.get_datasets(c, str(tmp_path / "w"))
  assert np.array_equal(memory.train_pairs.inputs_flat, d.train_pairs.inputs_flat)
  assert memory.corpus_counts == d.corpus_counts


def test_length_ratio_filter_drops_exactly_the_pairs_beyond_the_bound(tmp_path):
  directory = tmp_path / "c"
  directory.mkdir()
  _write(directory, "train", 200, 3, stretch_every=7)
  c = support.textfiles_config(
    directory,
    dev="",
    test="",
    vocab_size=60,
    vocab_byte_fallback=False,
    max_len=64,
    tokens_per_batch=512,
    prefetch_batches=0,
    max_length_ratio=2.5,
  )
  d = data.get_datasets(c, str(tmp_path / "w"))
  src = (directory / "train.en").read_text().splitlines()
  tgt = (directory / "train.de").read_text().splitlines()
  lengths = [(len(d.tokenizer.encode(s)), len(d.tokenizer.encode(t))) for s, t in zip(src, tgt)]
  assert max(max(pair) for pair in lengths) < 63  # nothing dropped by max_len
  beyond = [max(s, t) / max(1, min(s, t)) > 2.5 for s, t in lengths]
  assert 10 < sum(beyond) < 100
  assert d.stats.train.dropped_by_ratio == sum(beyond)
  assert len(d.train_pairs) == 200 - sum(beyond)
  kept = [lengths[i] for i in range(200) if not beyond[i]]
  assert np.array_equal(d.train_pairs.inputs_lengths - 1, [s for s, _ in kept])
  assert f"{sum(beyond)} dropped by length ratio" in d.stats.summary()
  assert tokenized.beyond_ratio(1, 3, 2.5) and not tokenized.beyond_ratio(2, 5, 2.5)


def test_single_train_files_stay_one_corpus(tmp_path):
  c = _config(tmp_path / "c")
  single = support.textfiles_config(
    tmp_path / "c", train="a", dev="", test="", **{k: c[k] for k in ("vocab_size", "max_len")}
  )
  single.update(
    vocab_byte_fallback=False, tokens_per_batch=256, prefetch_batches=0, bucket_boundaries=(8, 16)
  )
  as_list = single.copy_and_resolve_references()
  as_list.train_source = as_list.train_target = ""
  as_list.train_corpora = (dict(source=single.train_source, target=single.train_target),)
  one = data.get_datasets(single, str(tmp_path / "w1"))
  listed = data.get_datasets(as_list, str(tmp_path / "w2"))
  assert one.sample is None and listed.sample is None and not one.stats.corpora
  x, y = one.train_iter(), listed.train_iter()
  assert all(_equal(next(x), next(y)) for _ in range(10))


def _error(c, workdir):
  with pytest.raises(data.DataError) as e:
    data.get_datasets(c, str(workdir))
  message = str(e.value)
  assert "\n" not in message
  return message


@pytest.mark.parametrize("weight", [0, -1.5, "2"])
def test_a_weight_not_above_zero_is_refused(tmp_path, weight):
  message = _error(_config(tmp_path / "c", weights=(1.0, weight)), tmp_path / "w")
  assert "config.data.train_corpora[1].weight" in message and "> 0" in message
  assert not (tmp_path / "w").exists()  # before any vocabulary or store


def test_a_missing_corpus_file_is_named(tmp_path):
  c = _config(tmp_path / "c")
  c.train_corpora[1]["target"] = str(tmp_path / "c" / "nope.de")
  message = _error(c, tmp_path / "w")
  assert "nope.de: no such file (config.data.train_corpora[1].target)" in message
  assert not (tmp_path / "w").exists()


def test_a_tag_that_cannot_be_one_piece_is_refused(tmp_path):
  message = _error(_config(tmp_path / "c", tags=("", "<b t>")), tmp_path / "w")
  assert "config.data.train_corpora[1].tag='<b t>' cannot be one vocabulary piece" in message
  # A vocabulary built without the tag cannot hold it as one piece.
  untagged = _config(tmp_path / "c", tags=("", ""))
  data.get_datasets(untagged, str(tmp_path / "w"))
  message = _error(_config(tmp_path / "c", tags=("", "<nt>")), tmp_path / "w")
  assert "prepared for config.data.train_corpora[1].tag=''" in message  # the store first
  shutil.rmtree(tmp_path / "w" / "prepared")
  message = _error(_config(tmp_path / "c", tags=("", "<nt>")), tmp_path / "w")
  assert "config.data.train_corpora[1].tag='<nt>' is not one piece of the vocabulary" in message
  assert str(tmp_path / "w" / "vocab.model") in message


def test_an_empty_list_and_other_sources_are_refused(tmp_path):
  c = _config(tmp_path / "c")
  c.train_corpora = ()
  assert "train_corpora is empty" in _error(c, tmp_path / "w")
  c = _config(tmp_path / "c", source="synthetic")
  assert "config.data.source='synthetic'" in _error(c, tmp_path / "w")
  c = _config(tmp_path / "c")
  c.train_source, c.train_target = c.train_corpora[0]["source"], c.train_corpora[0]["target"]
  assert "both set" in _error(c, tmp_path / "w")
  c = _config(tmp_path / "c")
  c.train_corpora = (dict(c.train_corpora[0], weigth=2),)
  assert "unknown field(s) ['weigth']" in _error(c, tmp_path / "w")
  assert "max_length_ratio=0.5" in _error(_config(tmp_path / "c", max_length_ratio=0.5), tmp_path)


# Upsampling factors against a table computed by hand: (pairs kept, weight) -> how many slots
# of an epoch hold the corpus's pairs: floor(w) copies + round(frac(w) * kept) (at least 1
# when w < 1). Rows marked * are where rounding and truncation differ.
SAMPLE_TABLE = [
  # kept, weight, copies of each pair, extra pairs, slots
  (10, 1.0, 1, 0, 10),
  (10, 2.0, 2, 0, 20),
  (10, 0.37, 0, 4, 4),  # * 3.7 -> 4, not 3
  (10, 1.26, 1, 3, 13),  # * 2.6 -> 3
  (3, 1.5, 1, 2, 5),  # * 1.5 -> 2 (round half to even: 2)
  (7, 2.1, 2, 1, 15),  # 0.7 -> 1 *
  (10, 0.01, 0, 1, 1),  # 0.1 -> 0, but a corpus of weight < 1 keeps one pair
  (4, 3.0, 3, 0, 12),
  (0, 2.5, 0, 0, 0),  # an empty corpus stays empty
]


def test_sample_counts_equal_the_hand_computed_table():
  kept = [row[0] for row in SAMPLE_TABLE]
  weights = [row[1] for row in SAMPLE_TABLE]
  got = mixture.sample(kept, weights, seed=3)
  counts = np.bincount(got, minlength=sum(kept))
  start = 0
  for k, (n, w, copies, extra, slots) in enumerate(SAMPLE_TABLE):
    mine = counts[start : start + n]
    assert mine.sum() == slots, (k, n, w)
    assert np.sum(mine == copies + 1) == extra and np.sum(mine == copies) == n - extra, (k, w)
    # The extra pairs are the documented seeded draw of corpus k.
    if extra:
      chosen = np.random.default_rng([3, k]).choice(n, size=extra, replace=False)
      assert np.array_equal(np.flatnonzero(mine == copies + 1), np.sort(chosen)), k
    start += n
  # Slots of a corpus are its own pairs (stored one corpus after the other), in order.
  starts = np.cumsum([0, *kept])
  corpus_of_slot = np.searchsorted(starts, got, side="right") - 1
  assert np.all(np.diff(corpus_of_slot) >= 0)


def test_shares_of_pairs_and_tokens_equal_the_hand_computed_table():
  # Corpora of 2, 3 and 1 pairs, factors 2, 1 and 0.5 (at least one pair: its one pair).
  kept, weights = [2, 3, 1], [2.0, 1.0, 0.5]
  tokens = np.array([4, 6, 1, 1, 2, 10])  # source + target tokens of each stored pair
  sample = mixture.sample(kept, weights, seed=0)
  assert sorted(sample.tolist()) == [0, 0, 1, 1, 2, 3, 4, 5]
  pairs, toks = mixture.shares(kept, sample, tokens)
  # Slots: 4 of corpus 0, 3 of corpus 1, 1 of corpus 2; tokens 2*(4+6), 1+1+2, 10 of 34.
  np.testing.assert_allclose(pairs, [4 / 8, 3 / 8, 1 / 8], rtol=1e-12)
  np.testing.assert_allclose(toks, [20 / 34, 4 / 34, 10 / 34], rtol=1e-12)
  # Every factor 1: no sample, each pair once.
  pairs, toks = mixture.shares(kept, None, tokens)
  np.testing.assert_allclose(pairs, [2 / 6, 3 / 6, 1 / 6], rtol=1e-12)
  np.testing.assert_allclose(toks, [10 / 24, 4 / 24, 10 / 24], rtol=1e-12)


def test_tags_are_the_distinct_non_empty_tags_in_order_of_first_use():
  import ml_collections

  c = ml_collections.ConfigDict(dict(train_source="", train_target=""))
  c.train_corpora = tuple(
    dict(source=f"{i}.en", target=f"{i}.de", tag=tag)
    for i, tag in enumerate(["<b>", "", "<a>", "<b>", "<c>"])
  )
  assert mixture.tags(c) == ["<b>", "<a>", "<c>"]
  got = mixture.corpora(c)
  assert [k.tag for k in got] == ["<b>", "", "<a>", "<b>", "<c>"]
  assert [k.flag for k in got] == [f"train_corpora[{i}]" for i in range(5)]
  assert all(k.weight == 1.0 for k in got)
  c.train_corpora = ()
  assert mixture.tags(c) == []
