"""Sampling: the truncations against numpy, the drawn frequencies against the truncated,
renormalised softmax, temperature -> 0 against greedy, reproducibility whatever the batch,
and the bad settings refused in one line before any work."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from t2t_jax.cli import translate as translate_cli
from t2t_jax.decoding import SearchConfig, search, search_batch
from t2t_jax.decoding.sampling import (
  draw_tokens,
  sample_keys,
  sampling_log_probs,
  top_k_log_probs,
  top_p_log_probs,
)
from t2t_jax.decoding.translator import TranslateError, Translator, one_line
from t2t_jax.run.workdir import Workdir
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID
from tests import support
from tests.test_train import small_config


@pytest.fixture(scope="module")
def workdir():
  return support.small_trained_workdir()


@pytest.fixture(scope="module")
def config_only(tmp_path_factory):
  """A directory with only a config.json: enough for the flag checks, which come first."""
  path = tmp_path_factory.mktemp("config_only")
  with open(Workdir(path).config_file, "w") as f:
    f.write(small_config().to_json())
  return str(path)


# ----------------------------------------------------------------------------- numpy reference


def np_sampling_probs(log_probs: np.ndarray, temperature=1.0, topk=0, topp=1.0) -> np.ndarray:
  """The distribution one row is drawn from, row by row in float64: softmax(log p / T), the
  tokens below the k-th largest dropped (ties kept), renormalised, then only the tokens whose
  more probable tokens hold less than p (ties with the last one kept), renormalised."""
  out = []
  for row in np.asarray(log_probs, np.float64):
    with np.errstate(invalid="ignore"):
      p = np.exp(row / temperature - np.max(row / temperature))
    p = np.nan_to_num(p) / np.nansum(p)
    if 0 < topk < len(p):
      p = np.where(p >= np.sort(p)[::-1][topk - 1], p, 0.0)
      p /= p.sum()
    if topp < 1:
      order = np.argsort(-p, kind="stable")
      above = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
      last = p[order][above < topp].min()
      p = np.where(p >= last, p, 0.0)
      p /= p.sum()
    out.append(p)
  return np.array(out)


def _log_probs(rows=6, vocab=12, seed=0):
  """Normalised log-probabilities with a tie and a -inf entry."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(rows, vocab)) * 2
  logits[0, 3] = logits[0, 5]  # a tie
  logits[1, 2] = -np.inf
  return np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)))


@pytest.mark.parametrize("k", [0, 1, 3, 12, 20])
def test_top_k_keeps_the_k_best_as_numpy(k):
  log_probs = _log_probs()
  got = np.asarray(top_k_log_probs(jnp.asarray(log_probs), k))
  for row, out in zip(log_probs, got):
    kth = np.sort(row)[::-1][min(k, len(row)) - 1] if k else -np.inf
    np.testing.assert_array_equal(out, np.where(row >= kth, row, -np.inf))


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999, 1.0])
def test_top_p_keeps_the_nucleus_as_numpy(p):
  log_probs = _log_probs()
  got = np.asarray(top_p_log_probs(jnp.asarray(log_probs), p))
  want = np_sampling_probs(log_probs, topp=p)
  np.testing.assert_array_equal(np.isfinite(got), want > 0)
  kept = np.isfinite(got)
  np.testing.assert_array_equal(got[kept], log_probs[kept])  # cut, not renormalised
  # The nucleus is the smallest prefix of the sorted tokens holding p (up to ties).
  for row, keep in zip(np.exp(log_probs), kept):
    assert row[keep].sum() >= min(p, 1.0) - 1e-6
    assert row[keep].sum() - row[keep].min() < p or keep.sum() == 1


@pytest.mark.parametrize(
  "temperature, topk, topp", [(1.0, 0, 1.0), (0.5, 4, 1.0), (2.0, 0, 0.7), (1.3, 5, 0.6)]
)
def test_sampling_distribution_matches_numpy(temperature, topk, topp):
  log_probs = _log_probs()
  got = sampling_log_probs(jnp.asarray(log_probs), temperature, topk, topp)
  want = np_sampling_probs(log_probs, temperature, topk, topp)
  np.testing.assert_allclose(np.exp(np.asarray(got)), want, atol=1e-6)


# ----------------------------------------------------------------------------- drawn frequencies

VOCAB = 7
# A Markov chain over VOCAB tokens: the next token's logits depend on the last token only.
TABLE = np.random.default_rng(3).normal(size=(VOCAB, VOCAB)).astype(np.float32) * 1.5
TABLE[BOS_ID, EOS_ID] = -1e9  # nor an empty output


def _chain(ids, cache):
  return jnp.asarray(TABLE)[ids[:, 0]], cache


@functools.partial(jax.jit, static_argnames=("temperature", "topk", "topp", "rows", "length"))
def _draw(temperature, topk, topp, seed, rows, length):
  keys = sample_keys(seed, jnp.arange(rows), 1)
  settings = SearchConfig(
    beam_size=1,
    sampling=True,
    sampling_temperature=temperature,
    sampling_topk=topk,
    sampling_topp=topp,
  )
  return search.sample_search(
    _chain,
    jnp.zeros((rows,)),
    max_lengths=jnp.full((rows,), length),
    max_decode_len=length,
    keys=keys,
    search=settings,
  )


def _without_pad_and_bos(log_probs: np.ndarray) -> np.ndarray:
  """What sampling draws from: the model's distribution with PAD and BOS removed."""
  return np.where(np.isin(np.arange(log_probs.shape[-1]), [PAD_ID, BOS_ID]), -np.inf, log_probs)


def _conditional(prev: int, temperature, topk, topp) -> np.ndarray:
  log_probs = _without_pad_and_bos(np.asarray(jax.nn.log_softmax(jnp.asarray(TABLE[prev]))))[None]
  return np_sampling_probs(log_probs, temperature, topk, topp)[0]


def test_draw_tokens_inverts_the_cumulative_distribution_as_numpy():
  """Each row's token is the first whose float64 cumulative probability exceeds the row's
  uniform number times the total; tokens of probability 0 (inside and at the end of the
  vocabulary) are never drawn, whatever the uniform number."""
  from scipy import stats  # imported here: collecting the module stays quick

  rows, vocab = 4000, 12
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(rows, vocab)) * 2
  logits[:, [2, 7, 10, 11]] = -np.inf  # zero-probability tokens, the last two at the end
  log_probs = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32))
  keys = sample_keys(5, np.arange(rows), 1)
  tokens = np.asarray(draw_tokens(keys, log_probs))
  u = np.asarray(jax.vmap(jax.random.uniform)(keys), np.float64)
  cumulative = np.cumsum(np.exp(np.asarray(log_probs, np.float64)), axis=-1)
  want = np.array([np.searchsorted(c, x * c[-1], side="right") for c, x in zip(cumulative, u)])
  # float32 sums against float64: a row whose u lands within rounding of a boundary may
  # differ by one token; nearly all rows agree exactly.
  assert np.mean(tokens == want) > 0.999
  assert not np.isin(tokens, [2, 7, 10, 11]).any()
  halves = jnp.log(jnp.asarray([[0.5, 0.5, 0.0]] * rows))
  edge = np.bincount(np.asarray(draw_tokens(keys, halves)), minlength=3)
  assert edge[2] == 0 and stats.binomtest(int(edge[0]), rows).pvalue > 1e-3


def test_draw_tokens_never_passes_the_last_possible_token(monkeypatch):
  """u * total can round up to the total in float32; the draw is then the last token of
  nonzero probability, not one past it (simulated with a uniform number of exactly 1)."""
  monkeypatch.setattr(jax.random, "uniform", lambda key: jnp.float32(1.0))
  log_probs = jnp.log(jnp.asarray([[0.5, 0.5, 0.0, 0.0], [0.25, 0.0, 0.75, 0.0]]))
  keys = sample_keys(0, np.arange(2), 1)
  np.testing.assert_array_equal(draw_tokens(keys, log_probs), [1, 2])


@pytest.mark.parametrize(
  "temperature, topk, topp", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.5, 0, 0.6), (1.0, 4, 0.8)]
)
def test_drawn_pairs_follow_the_truncated_renormalised_softmax(temperature, topk, topp):
  from scipy import stats  # imported here: collecting the module stays quick

  rows = 6000
  seqs, log_probs = _draw(temperature, topk, topp, 11, rows, 3)
  seqs = np.asarray(seqs)
  first = _conditional(BOS_ID, temperature, topk, topp)
  # Never a token outside the cut distribution, at any step.
  assert np.all(first[seqs[:, 0]] > 0)
  for prev in range(VOCAB):
    after = seqs[seqs[:, 0] == prev]
    if prev != EOS_ID and len(after):
      assert np.all(_conditional(prev, temperature, topk, topp)[after[:, 1]] > 0)
  # The joint frequencies of the first two tokens: chi-square against p(a) p(b | a).
  expected, observed = [], []
  for a in np.flatnonzero(first):
    second = _conditional(a, temperature, topk, topp) if a != EOS_ID else np.eye(VOCAB)[PAD_ID]
    for b in np.flatnonzero(second):
      expected.append(rows * first[a] * second[b])
      observed.append(np.sum((seqs[:, 0] == a) & (seqs[:, 1] == b)))
  expected, observed = np.array(expected), np.array(observed)
  assert observed.sum() == rows
  rare = expected < 5  # pooled into one cell, so that the chi-square approximation holds
  if rare.any():
    expected = np.append(expected[~rare], expected[rare].sum())
    observed = np.append(observed[~rare], observed[rare].sum())
  assert stats.chisquare(observed, expected).pvalue > 1e-3, (observed, expected.round(1))
  # The log-probs returned are the model's own (untempered, uncut) of the tokens drawn.
  full = np.asarray(jax.nn.log_softmax(jnp.asarray(TABLE)))
  at_limit = np.where(seqs[:, 1] == EOS_ID, 0.0, full[seqs[:, 1], EOS_ID])  # forced EOS
  want = full[BOS_ID, seqs[:, 0]] + np.where(
    seqs[:, 0] == EOS_ID,
    0.0,
    full[seqs[:, 0], seqs[:, 1]] + np.where(seqs[:, 1] == EOS_ID, 0.0, at_limit),
  )
  np.testing.assert_allclose(np.asarray(log_probs), want, rtol=1e-5, atol=1e-5)


def test_a_wrong_distribution_fails_the_frequency_check():
  """The check above has power: samples at temperature 1 fail against temperature 0.7."""
  from scipy import stats  # imported here: collecting the module stays quick

  seqs = np.asarray(_draw(1.0, 0, 1.0, 11, 6000, 3)[0])
  wrong = _conditional(BOS_ID, 0.7, 0, 1.0)
  observed = np.bincount(seqs[:, 0], minlength=VOCAB)[wrong > 0]
  assert stats.chisquare(observed, 6000 * wrong[wrong > 0]).pvalue < 1e-6


@pytest.mark.slow
def test_model_first_tokens_follow_its_top_k_softmax():
  """Through the Transformer's cache: one sentence sampled 4000 times, first tokens against
  the teacher-forced model's top-5 distribution at the first position."""
  from scipy import stats  # imported here: collecting the module stays quick

  model, params = support.small_model()
  inputs = np.array([[5, 9, 7, 1]], np.int32)
  settings = SearchConfig(beam_size=1, sampling=True, num_samples=4000, sampling_topk=5)
  seqs, _ = search_batch(
    params, inputs, [2], model=model, max_decode_len=2, search=settings, nbest=4000
  )
  first = np.asarray(seqs)[0, :, 0]
  eos = np.array([[EOS_ID]], np.int32)
  logits = support.jit_apply(model, {"params": params}, inputs, eos)[0, 0]
  log_probs = _without_pad_and_bos(np.asarray(jax.nn.log_softmax(logits)))
  want = np_sampling_probs(log_probs[None], topk=5)[0]
  assert set(first) <= set(np.flatnonzero(want))
  keep = want > 0
  observed = np.bincount(first, minlength=len(want))[keep]
  assert stats.chisquare(observed, 4000 * want[keep]).pvalue > 1e-3


# ----------------------------------------------------------------------------- model paths


@pytest.mark.slow
def test_temperature_towards_zero_is_greedy():
  model, params = support.small_model(seed=2)
  inputs = np.array([[5, 6, 7, 1], [8, 9, 1, 0], [11, 12, 13, 14]], np.int32)
  limits = np.array([10, 12, 7], np.int32)
  kw = dict(model=model, max_decode_len=16)
  greedy = search_batch(params, inputs, limits, search=SearchConfig(beam_size=1), **kw)
  cold = SearchConfig(beam_size=1, sampling=True, sampling_temperature=1e-5, sampling_seed=4)
  np.testing.assert_array_equal(search_batch(params, inputs, limits, search=cold, **kw), greedy)
  warm = SearchConfig(beam_size=1, sampling=True, sampling_seed=4)
  assert not np.array_equal(search_batch(params, inputs, limits, search=warm, **kw), greedy)


@pytest.mark.slow
def test_samples_depend_on_the_seed_and_index_not_the_batch():
  model, params = support.small_model(seed=1)
  settings = SearchConfig(beam_size=1, sampling=True, num_samples=3, sampling_seed=7)
  kw = dict(model=model, max_decode_len=16, search=settings, nbest=3)
  one = np.array([[5, 6, 7, 1]], np.int32)
  alone = np.asarray(search_batch(params, one, [12], sentence_ids=[4], **kw)[0])
  batch = np.array([[9, 9, 9, 9, 9, 1], [5, 6, 7, 1, 0, 0], [8, 1, 0, 0, 0, 0], [0] * 6])
  found = np.asarray(search_batch(params, batch, [9, 12, 5, 1], sentence_ids=[0, 4, 2, 0], **kw)[0])
  np.testing.assert_array_equal(found[1], alone[0])
  assert len({tuple(s) for s in alone[0]}) > 1  # three different samples
  other = dict(kw, search=SearchConfig(beam_size=1, sampling=True, num_samples=3, sampling_seed=8))
  assert not np.array_equal(search_batch(params, one, [12], sentence_ids=[4], **other)[0], alone)


@pytest.mark.slow
def test_translator_samples_by_input_index(workdir):
  t = Translator.from_workdir(workdir)
  four = t.search.override(num_samples=4, sampling_seed=3)
  a = t.sample(["1 2 3", "4 5 6 7 1 2", "7 7"], search=four, nbest=4)
  b = t.sample(["5", "6 5 4 3 2 1 7", "7 7", "1 2"], search=four, nbest=4)
  assert a[2] == b[2]
  assert [h.text for h in a[0]] != [h.text for h in b[0]]
  for hyps in a:
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
  # Without nbest, the best-scoring sample.
  assert t.sample(["1 2 3", "4 5 6 7 1 2", "7 7"], search=four) == [h[0].text for h in a]
  with pytest.raises(TranslateError, match="^nbest=5: must be between 1 and num_samples=4$"):
    t.sample(["1"], search=four, nbest=5)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
  "fields, message",
  [
    (
      dict(sampling=True),
      "^sampling=True draws tokens, it does not search: beam_size=4 must be 1$",
    ),
    (dict(sampling_temperature=0.0), r"^sampling_temperature=0\.0 must be > 0$"),
    (dict(sampling_topp=0.0), r"^sampling_topp=0\.0 must be in \(0, 1\]"),
    (dict(sampling_topp=1.5), r"^sampling_topp=1\.5 must be in \(0, 1\]"),
    (dict(sampling_topk=-1), "^sampling_topk=-1 must be >= 0"),
    (dict(num_samples=0), "^num_samples=0 must be >= 1$"),
  ],
)
def test_bad_sampling_settings_are_refused_naming_the_field(fields, message):
  with pytest.raises(ValueError, match=message):
    SearchConfig(**fields)
  with pytest.raises(ValueError, match="^config." + message.lstrip("^")):
    SearchConfig.from_config(fields)


class _OwnFlags:
  """absl.flags aimed at a private FlagValues, so that each run defines t2t-translate's flags
  afresh."""

  def __init__(self) -> None:
    self.FLAGS = flags.FlagValues()

  def __getattr__(self, name):
    value = getattr(flags, name)
    if name.startswith("DEFINE"):
      return functools.partial(value, flag_values=self.FLAGS)
    return value


def _translate(monkeypatch, *args):
  monkeypatch.setattr(translate_cli, "flags", _OwnFlags())
  parsed = translate_cli._define_flags()
  parsed(["t2t-translate", *args])
  monkeypatch.setattr(translate_cli._define_flags, "flags", parsed, raising=False)
  translate_cli.main(["t2t-translate"])


@pytest.mark.parametrize(
  "args, message",
  [
    (
      ["--sampling", "--beam_size=4"],
      "--sampling draws tokens instead of searching: --beam_size=4 must be 1",
    ),
    (["--sampling", "--sampling_temperature=0"], "--sampling_temperature=0.0 must be > 0"),
    (["--sampling", "--sampling_topp=1.2"], r"--sampling_topp=1.2 must be in (0, 1]"),
    (["--sampling", "--sampling_topp=0"], r"--sampling_topp=0.0 must be in (0, 1]"),
    (["--sampling", "--sampling_topk=-2"], "--sampling_topk=-2 must be >= 0"),
    (
      ["--sampling", "--num_samples=2", "--nbest=3"],
      "--nbest=3: must be between 1 and num_samples=2 (0: off)",
    ),
    (["--sampling_topk=5"], "--sampling_topk shapes sampling: add --sampling"),
  ],
)
def test_translate_refuses_bad_sampling_flags_before_loading(
  config_only, monkeypatch, args, message
):
  loaded = []
  monkeypatch.setattr(translate_cli.Translator, "from_workdir", lambda *a, **k: loaded.append(a))
  with pytest.raises(SystemExit) as e:
    _translate(monkeypatch, f"--workdir={config_only}", *args)
  text = str(e.value)
  assert text.startswith("t2t-translate: " + message) and "\n" not in text, text
  assert not loaded


@pytest.mark.parametrize("args, constrained", [([], True), (["--noconstrained"], False)])
def test_translate_constrained_flag_sets_the_search(config_only, monkeypatch, args, constrained):
  """--noconstrained reaches the Translator's search; without it the workdir's setting."""
  searches = []

  def capture(*a, search, **k):
    searches.append(search)
    raise translate_cli.TranslateError("stop here")

  monkeypatch.setattr(translate_cli.Translator, "from_workdirs", capture)
  with pytest.raises(SystemExit, match="stop here"):
    _translate(monkeypatch, f"--workdir={config_only}", "--input=/dev/null", *args)
  assert [s.constrained for s in searches] == [constrained]


@pytest.mark.slow
def test_translate_command_prints_the_translators_samples(workdir, tmp_path, monkeypatch, capsys):
  source = tmp_path / "src.txt"
  source.write_text("1 2 3\n4 5\n7 7 7\n")
  _translate(
    monkeypatch,
    f"--workdir={workdir}",
    f"--input={source}",
    "--sampling",
    "--num_samples=3",
    "--nbest=2",
    "--sampling_topk=6",
    "--sampling_topp=0.9",
    "--sampling_temperature=0.8",
    "--seed=5",
  )
  lines = capsys.readouterr().out.splitlines()
  t = Translator.from_workdir(workdir)
  fields = dict(sampling_temperature=0.8, sampling_topk=6, sampling_topp=0.9, sampling_seed=5)
  want = t.sample(
    ["1 2 3", "4 5", "7 7 7"], search=t.search.override(num_samples=3, **fields), nbest=2
  )
  assert lines == [
    f"{i}\t{r}\t{h.score:.6f}\t{h.log_prob:.6f}\t{h.text}"
    for i, hyps in enumerate(want)
    for r, h in enumerate(hyps, start=1)
  ]


@pytest.mark.slow
def test_bench_times_sampling_with_the_configs_fields():
  from t2t_jax.bench import decode, report

  config = small_config(sampling_topk=5, num_samples=2)
  search = SearchConfig.from_config(config)
  out = decode.measure_decode(config, 40, 4, search, sampling=True)
  assert [out[name]["beam_size"] for name in ("beam", "greedy", "sampling")] == [4, 1, 1]
  assert out["sampling"]["target_tokens"] > 0
  assert any(line.startswith("  sampling 1: ") for line in report._decode_lines(out))
  assert "sampling" not in decode.measure_decode(config, 40, 4, search)


def test_line_breaks_in_an_output_become_spaces():
  assert one_line("a\nb\r\nc\td") == "a b  c d"


@pytest.mark.slow
def test_translator_outputs_stay_one_line_whatever_the_pieces_decode_to(workdir, monkeypatch):
  """A byte-fallback vocabulary can decode a drawn piece to a newline or a tab; every output
  of translate and sample is still one line."""
  t = Translator.from_workdir(workdir)
  monkeypatch.setattr(t.tokenizer, "decode", lambda ids: "a\nb\tc\r")
  assert t.translate(["1 2", "3"]) == ["a b c ", "a b c "]
  two = t.search.override(num_samples=2, sampling_seed=1)
  for hyps in t.sample(["1 2", "3"], search=two, nbest=2):
    assert [h.text for h in hyps] == ["a b c "] * 2
