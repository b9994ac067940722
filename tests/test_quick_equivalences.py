"""Small versions of the slow equivalence tests, so that the quick loop (-m "not slow") checks
every equivalence the project claims; the slow set keeps the large versions:

- beam search through the Transformer's beam-aware cache equals the reference search over
  its per-row cache (test_decode.py::test_transformer_beam_search_equals_reference);
- 8 devices give the update of 1 (test_train.py::test_eight_devices_equal_one_device);
- accumulating micro-batches gives the update of their union as one batch
  (test_train.py::test_gradient_accumulation_equals_one_big_batch);
- stopping and resuming gives the run that never stopped (test_train.py::test_resume_is_exact);
- exported models compute what t2t_jax computes (test_export_ctranslate2.py::
  test_tiny_model_greedy_and_scores_match, test_export_huggingface.py::
  test_tiny_model_greedy_outputs_and_logits_match), here on a random model.

The training comparisons update with plain SGD: Adam divides each step by the root of its own
second moment, so a gradient off by a constant factor (a wrong token count) moves Adam's
parameters almost exactly as the right one does, while an SGD step is the gradient itself.
"""

import functools
import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from t2t_jax.data.tokenizer import SymbolTokenizer
from t2t_jax.decoding import SearchConfig
from t2t_jax.decoding import translator as translate
from t2t_jax.export import Trained, vocabulary_tokens
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.run import checkpoint
from t2t_jax.run.workdir import Workdir, read_metrics
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from t2t_jax.training import optim, parallel, steps
from t2t_jax.training import trainer as train
from tests import support
from tests.test_decode import model_and_reference_searches
from tests.test_train import _random_global_batch, _split, small_config

# --- beam search through the model's cache ----------------------------------------------------


def test_transformer_beam_search_equals_reference_search():
  """Six sentences of source lengths 2..7, beam 4, alpha 0.6: the Translator's search (shared
  encoder keys/values, in-place slots read through BeamSlots) returns the reference search's
  sequences, and its scores to rounding."""
  model, params = support.small_model(seed=10, share_embeddings=False)
  rng = np.random.default_rng(10)
  batch, src_len, max_decode_len, beam_size = 6, 7, 12, 4
  lengths = rng.permutation(np.arange(2, src_len + 1))
  inputs = rng.integers(4, model.config.vocab_size, size=(batch, src_len))
  inputs[np.arange(src_len) >= lengths[:, None]] = PAD_ID
  inputs, max_lengths = jnp.asarray(inputs, jnp.int32), jnp.asarray(lengths + 4, jnp.int32)
  # Peaked distributions and a likelier EOS: outputs end at different lengths (random
  # parameters as they are give flat distributions, where ending at once scores best).
  output = params["decoder"]["logits"]
  output["kernel"] = output["kernel"] * 8.0
  output["bias"] = output["bias"].at[EOS_ID].set(3.0)

  seqs, scores, ref_seqs, ref_scores = model_and_reference_searches(
    model, params, inputs, max_lengths, max_decode_len, beam_size
  )
  out_lengths = np.sum(np.asarray(ref_seqs) != PAD_ID, axis=2)
  assert len(set(out_lengths[:, 0].tolist())) >= 3, out_lengths  # best outputs of 3+ lengths
  assert np.all(np.isfinite(np.asarray(ref_scores)))  # every beam slot holds a hypothesis
  np.testing.assert_array_equal(seqs, ref_seqs)
  # The same function computed in differently shaped arrays: equal to rounding, not bitwise.
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-6, atol=1e-6)


# --- data-parallel and accumulated steps ------------------------------------------------------

LEARNING_RATE = 0.5
LABEL_SMOOTHING = 0.2  # not the paper's 0.1: a step built with a fixed 0.1 shows
ROWS_PER_DEVICE, MICRO_BATCHES = 6, 3


@pytest.fixture(scope="module")
def sgd_training():
  """(model, host TrainState with SGD, schedule, the 8-device fused step, two global batches).

  One fused step for the module: the device and accumulation tests compare against the
  same compiled program.
  """
  model, params = support.small_model()
  state = steps.TrainState.create(params, optax.sgd(LEARNING_RATE), jax.random.PRNGKey(1))
  schedule = optim.optimizer_schedule(model.config.d_model, 4)
  fused = parallel.pmap_train_step(model, LABEL_SMOOTHING, schedule)
  rows = 8 * ROWS_PER_DEVICE
  batches = [_random_global_batch(rows=rows, seed=seed) for seed in (0, 1)]
  return model, jax.device_get(state), schedule, fused, batches


def _fused_steps(fused, state, batches):
  """Params and per-step metrics (host) after one fused 8-device step per global batch."""
  p_state, metrics = parallel.replicate(state), []
  for batch in batches:
    p_state, m = fused(p_state, parallel.shard(_split(batch, 8)))
    metrics.append(parallel.host_metrics(m))
  return parallel.unreplicate(p_state.params), metrics


def _assert_same_updates(params, metrics, ref_params, ref_metrics, initial, batches):
  moved = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(jax.tree.leaves(ref_params), jax.tree.leaves(initial))
  )
  assert moved > 1e-3  # the steps did change the parameters
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for m, ref, batch in zip(metrics, ref_metrics, batches, strict=True):
    assert m["denominator"] == ref["denominator"] == float((batch["targets"] != PAD_ID).sum())
    for key in ("loss", "nll", "correct", "grad_norm", "learning_rate"):
      np.testing.assert_allclose(m[key], ref[key], rtol=1e-5, err_msg=key)


def test_eight_devices_give_the_single_device_updates(sgd_training):
  """Two SGD steps on a global batch split over 8 devices equal the same steps with the
  whole batch on one: the gradient sums and token counts are reduced over devices before
  the one division."""
  assert jax.local_device_count() == 8, "tests run with 8 simulated CPU devices (conftest)"
  model, state, schedule, fused, batches = sgd_training
  params8, metrics8 = _fused_steps(fused, state, batches)
  step1 = jax.pmap(
    functools.partial(
      steps.train_step, model=model, label_smoothing=LABEL_SMOOTHING, schedule=schedule
    ),
    axis_name=parallel.AXIS,
    devices=jax.local_devices()[:1],
  )
  # The state goes back to the host between steps, so both calls see the same input layout
  # and share one compilation.
  s1, metrics1 = jax.tree.map(lambda x: np.asarray(x)[None], state), []
  for batch in batches:
    s1, m = step1(s1, _split(batch, 1))
    s1 = jax.device_get(s1)
    metrics1.append({k: float(v[0]) for k, v in jax.device_get(m).items()})
  params1 = jax.tree.map(lambda x: x[0], s1.params)
  _assert_same_updates(params8, metrics8, params1, metrics1, state.params, batches)


def test_accumulated_micro_batches_give_the_one_batch_updates(sgd_training):
  """The trainer's accumulation (3 micro-batches of 2 rows per device, then one update)
  equals the fused step on their 6-row union, for two SGD steps: gradients and token counts
  are summed over micro-batches and divided once."""
  model, state, _, fused, batches = sgd_training
  ref_params, ref_metrics = _fused_steps(fused, state, batches)
  config = ml_collections.ConfigDict(
    dict(
      warmup_steps=4,
      learning_rate_factor=1.0,
      label_smoothing=LABEL_SMOOTHING,
      grad_accum_steps=MICRO_BATCHES,
    )
  )
  trainer = train.Trainer(config, "", model, None, None, None, len(batches))
  size = ROWS_PER_DEVICE // MICRO_BATCHES
  micro = [
    parallel.shard({k: v[:, i * size : (i + 1) * size] for k, v in _split(batch, 8).items()})
    for batch in batches
    for i in range(MICRO_BATCHES)
  ]
  p_state, metrics, micro = parallel.replicate(state), [], iter(micro)
  for _ in batches:
    p_state, m = trainer.train_step(p_state, micro)
    metrics.append(parallel.host_metrics(m))
  params = parallel.unreplicate(p_state.params)
  _assert_same_updates(params, metrics, ref_params, ref_metrics, state.params, batches)


# --- resume ------------------------------------------------------------------------------------


def _tiny_run(num_train_steps):
  """A small trainer run: one layer of each kind, 8-token sequences, 8 dev pairs, dropout 0.2
  (its keys must continue where the first run stopped), no BLEU or test."""
  return small_config(
    **{
      "model.max_len": 8,
      "model.dropout_rate": 0.2,
      "data.synthetic_train_size": 200,
      "data.synthetic_eval_size": 8,
      "data.synthetic_max_len": 6,
      "data.tokens_per_batch": 256,
      "data.max_len": 8,
      "data.pack_len": 8,
      "data.bucket_boundaries": (8,),
      "num_train_steps": num_train_steps,
      "eval_every_steps": 100,
      "checkpoint_every_steps": 100,
      "select_checkpoints": "",
    }
  )


def test_stopped_and_resumed_run_equals_the_uninterrupted_run(tmp_path):
  """4 steps straight == 2 steps (saved at the end), then a new run resuming to 4: the same
  logged losses and the same final parameters, bit for bit."""
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  train.train_and_evaluate(_tiny_run(4), straight)
  train.train_and_evaluate(_tiny_run(2), split)
  assert checkpoint.Checkpoints(split).steps() == [2]
  train.train_and_evaluate(_tiny_run(4), split)  # resumes from step 2
  with open(Workdir(split).starts_file, encoding="utf-8") as f:
    assert [json.loads(line)["step"] for line in f] == [0, 2]
  losses = lambda w: [(r["step"], r["loss"]) for r in read_metrics(w) if "loss" in r]
  assert [step for step, _ in losses(straight)] == [1, 2, 3, 4]
  assert losses(split) == losses(straight)
  ref = checkpoint.Checkpoints(straight).restore_params(4)
  got = checkpoint.Checkpoints(split).restore_params(4)
  for x, y in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
    np.testing.assert_array_equal(x, y)


# --- export numerics --------------------------------------------------------------------------

# Post-norm, sinusoidal positions: a shape both formats take. Separate output weights and
# bias, so that the random model can give the reserved ids a trained model's low scores.
EXPORT_MODEL = TransformerConfig(
  vocab_size=24,
  d_model=16,
  d_ff=32,
  num_heads=2,
  num_layers=2,
  max_len=32,
  share_embeddings=False,
)
EXPORT_EXTRA = 4  # output limit: source length (EOS included) + 4


def _pad(rows):
  out = np.full((len(rows), max(map(len, rows))), PAD_ID, np.int32)
  for r, ids in enumerate(rows):
    out[r, : len(ids)] = ids
  return out


class Exported(NamedTuple):
  """A random model and what t2t_jax computes with it."""

  trained: Trained
  source_ids: list  # six id lists ending with EOS
  greedy: list  # t2t_jax's greedy translations of them (the Translator's, beam_size=1)
  forced: tuple  # (sources, targets): the greedy outputs' ids and six random targets, with EOS
  logits: np.ndarray  # [rows, target length, vocab]: t2t_jax's on the forced pairs


@pytest.fixture(scope="module")
def random_export(tmp_path_factory):
  """A random model exported below, on six sources of 1 to 11 symbols.

  The parameters are drawn with the initialiser's shapes (nothing compiled): weights
  ~ N(0, 0.6), biases ~ N(0, 0.05), layer-norm scales ~ 1 + N(0, 0.2). PAD, BOS and UNK get
  output bias -8 (never targets, so a trained model hardly predicts them) and EOS +3: with
  this seed greedy outputs end at once, early and at their limits.
  """
  cfg = EXPORT_MODEL
  x = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  shapes = jax.eval_shape(Transformer(cfg).init, jax.random.PRNGKey(0), x, x)["params"]
  rng = np.random.default_rng(4)

  def draw(path, leaf):
    name = path[-1].key
    if name == "scale":
      return (1 + rng.normal(0, 0.2, leaf.shape)).astype(np.float32)
    return rng.normal(0, 0.05 if name == "bias" else 0.6, leaf.shape).astype(np.float32)

  params = jax.tree_util.tree_map_with_path(draw, shapes)
  output_bias = params["decoder"]["logits"]["bias"]
  output_bias[[PAD_ID, BOS_ID, UNK_ID]], output_bias[EOS_ID] = -8.0, 3.0
  tokenizer = SymbolTokenizer([str(i) for i in range(cfg.vocab_size - 4)])
  vocab_file = tmp_path_factory.mktemp("export") / "vocab.symbols"
  vocab_file.write_text("".join(s + "\n" for s in tokenizer.symbols))
  trained = Trained(cfg, params, tokenizer, vocabulary_tokens(tokenizer), str(vocab_file), [0])
  t2t = translate.Translator(
    Transformer(cfg), params, tokenizer, SearchConfig(max_output_extra=EXPORT_EXTRA)
  )
  lengths = (1, 3, 5, 7, 9, 11)
  sources = [" ".join(str(i) for i in rng.integers(0, cfg.vocab_size - 4, n)) for n in lengths]
  greedy = t2t.translate(sources, search=t2t.search.override(beam_size=1))
  source_ids = [tokenizer.encode(s) + [EOS_ID] for s in sources]
  targets = [tokenizer.encode(g) + [EOS_ID] for g in greedy] + [
    [*rng.integers(4, cfg.vocab_size, n), EOS_ID] for n in lengths
  ]
  forced = (source_ids * 2, targets)
  logits = jax.jit(t2t.model.apply)({"params": params}, *map(_pad, forced))
  return Exported(trained, source_ids, greedy, forced, np.asarray(logits))


def test_random_export_greedy_outputs_are_not_near_ties(random_export):
  """What the comparisons of greedy outputs below rely on: every greedy choice wins by far
  more than the engines' rounding, and the outputs differ in length and tokens, one ending
  with a chosen EOS before its limit."""
  log_probs = jax.nn.log_softmax(random_export.logits, axis=-1)
  lengths, limits = [], []
  for row, source in enumerate(random_export.source_ids):
    length, limit = len(random_export.forced[1][row]), len(source) + EXPORT_EXTRA
    chosen = length if length < limit else limit - 1  # the forced EOS is no choice
    top2 = np.sort(log_probs[row, :chosen], axis=-1)[:, -2:]
    assert np.all(top2[:, 1] - top2[:, 0] > 1e-3), (row, top2)
    lengths.append(length)
    limits.append(limit)
  greedy = random_export.greedy
  assert len(set(lengths)) >= 3 and min(lengths) == 1, greedy  # 1: EOS at once
  assert any(1 < n < limit for n, limit in zip(lengths, limits)), greedy
  assert len(set(" ".join(greedy).split())) >= 3, greedy


def test_ctranslate2_export_scores_and_greedy_outputs_equal_t2t_jax(random_export, tmp_path):
  ctranslate2 = pytest.importorskip("ctranslate2")
  from t2t_jax.export import to_ctranslate2

  trained, source_ids, greedy, (sources, targets), logits = random_export
  translator = ctranslate2.Translator(to_ctranslate2.export(trained, str(tmp_path / "ct2")))
  piece = trained.tokenizer.id_to_piece
  tokens = lambda rows: [[piece(i) for i in ids[:-1]] for ids in rows]  # without EOS
  # Forced targets: CTranslate2's per-token log-probabilities, EOS included.
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  for row, result in enumerate(translator.score_batch(tokens(sources), tokens(targets))):
    ours = log_probs[row, np.arange(len(targets[row])), targets[row]]
    np.testing.assert_allclose(result.log_probs, ours, atol=1e-4, rtol=0)
  # Greedy search: t2t_jax forces EOS at the limit (EOS included), CTranslate2 stops there
  # without one, so it gets limit - 1 tokens; t2t_jax may choose EOS first (an empty
  # output), which CTranslate2 allows only below its default min_decoding_length=1.
  for row, source in enumerate(tokens(source_ids)):
    limit = len(source_ids[row]) + EXPORT_EXTRA
    (result,) = translator.translate_batch(
      [source], beam_size=1, max_decoding_length=limit - 1, min_decoding_length=0
    )
    assert " ".join(result.hypotheses[0]) == greedy[row], row


def test_huggingface_export_logits_and_greedy_outputs_equal_t2t_jax(random_export, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("safetensors")
  from t2t_jax.export import to_huggingface

  trained, source_ids, greedy, forced, ours = random_export
  out = to_huggingface.export(trained, str(tmp_path / "hf"))
  model, info = transformers.MarianMTModel.from_pretrained(out, output_loading_info=True)
  assert not any(info.values()), info  # no missing, unexpected or mismatched weights
  model.eval()
  inputs, targets = map(_pad, forced)
  decoder_inputs = np.concatenate([np.full((len(targets), 1), BOS_ID), targets[:, :-1]], 1)
  with torch.no_grad():
    theirs = model(
      input_ids=torch.tensor(inputs),
      attention_mask=torch.tensor(inputs != PAD_ID),
      decoder_input_ids=torch.tensor(decoder_inputs),
      decoder_attention_mask=torch.tensor(decoder_inputs != PAD_ID),
    ).logits.numpy()
  real = targets != PAD_ID  # padded target positions are not defined the same way
  np.testing.assert_allclose(theirs[real], ours[real], atol=1e-4, rtol=0)
  # Greedy generation with max_new_tokens = t2t_jax's limit, where both force EOS.
  for row, ids in enumerate(source_ids):
    with torch.no_grad():
      (generated,) = model.generate(
        input_ids=torch.tensor([ids]),
        attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
        num_beams=1,
        do_sample=False,
        max_new_tokens=len(ids) + EXPORT_EXTRA,
      ).numpy()
    assert generated[0] == BOS_ID
    assert trained.tokenizer.decode(generated[1:]) == greedy[row], (row, generated)
