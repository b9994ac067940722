"""The Flax Transformer against the float64 numpy forward pass of tests/numpy_transformer.py.

Every parameter is re-drawn at random (LayerNorm scales and biases and all other biases
included, so no zero bias or unit scale can hide a term), batches are ragged, and only
non-pad positions are compared: the Flax model may put anything at pad positions.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.model import Transformer, TransformerConfig, shift_right
from tests import numpy_reference, numpy_transformer
from tests.support import SMALL_MODEL

# Each axis (norm, positions, embedding sharing, layer counts, head sizes) takes both values.
CONFIGS = {
  "post-sinusoidal-shared": dict(),
  "pre-learned-separate-2enc-dk6-dv5": dict(
    norm="pre",
    positional="learned",
    share_embeddings=False,
    num_encoder_layers=2,
    num_decoder_layers=1,
    d_k=6,
    d_v=5,
  ),
  "post-learned-separate-2dec-dk10-dv12": dict(
    positional="learned",
    share_embeddings=False,
    num_encoder_layers=1,
    num_decoder_layers=2,
    d_k=10,
    d_v=12,
  ),
  "pre-sinusoidal-shared-2x2": dict(norm="pre", num_layers=2),
}

# Source and target lengths per row: full rows, a heavily padded one, and mixed ones.
SOURCE_LENGTHS = (7, 2, 5, 6)
TARGET_LENGTHS = (6, 1, 4, 3)


def _batch(vocab_size: int, seed: int = 0):
  """Ragged right-padded (inputs [4, 7], targets [4, 6]); every row ends with EOS (1)."""
  rng = np.random.default_rng(seed)
  inputs = rng.integers(3, vocab_size, size=(len(SOURCE_LENGTHS), max(SOURCE_LENGTHS)))
  targets = rng.integers(3, vocab_size, size=(len(TARGET_LENGTHS), max(TARGET_LENGTHS)))
  for row, (s, t) in enumerate(zip(SOURCE_LENGTHS, TARGET_LENGTHS)):
    inputs[row, s - 1], inputs[row, s:] = 1, 0
    targets[row, t - 1], targets[row, t:] = 1, 0
  return inputs.astype(np.int32), targets.astype(np.int32)


def _random_leaf(path, shape, rng):
  """A normal draw for one parameter, scaled so activations stay O(1) through the layers."""
  names = [getattr(k, "key", str(k)) for k in path]
  leaf, module = names[-1], names[-2]
  if leaf == "kernel":
    # Attention W^O is [h, d_v, d_model] (contracts two axes); the rest contract the first.
    fan_in = int(np.prod(shape[:2])) if module == "out" and len(shape) == 3 else shape[0]
    return rng.normal(0.0, fan_in**-0.5, shape)
  if leaf == "scale":
    return rng.normal(1.0, 0.5, shape)
  if leaf == "bias":
    return rng.normal(0.0, 0.5, shape)
  if leaf == "embedding":
    return rng.normal(0.0, shape[1] ** -0.5, shape)  # unit variance after * sqrt(d_model)
  if leaf == "position_embedding":
    return rng.normal(0.0, 1.0, shape)
  raise AssertionError(f"no random draw for parameter {names}")


def _random_params(model, inputs, targets, seed):
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), inputs, targets)["params"]
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
    lambda path, s: jnp.asarray(_random_leaf(path, s.shape, rng), jnp.float32), shapes
  )


# Configurations whose incremental decoder (init_cache + decode_step) is checked too.
DECODE_CHECKED = ("post-sinusoidal-shared", "pre-learned-separate-2enc-dk6-dv5")


def _flax_outputs(model, params, inputs, targets, with_decoding):
  """One compiled function per configuration: teacher-forced logits [b, lt, vocab], encoder
  output [b, ls, d_model] and, with `with_decoding`, the logits of one decode_step per target
  position fed the shifted targets [b, lt, vocab] (the path the searches take)."""
  length = targets.shape[1]

  def incremental(p, i, encoded, decoder_inputs):
    _, variables = model.apply(
      {"params": p}, encoded, i, length, method=Transformer.init_cache, mutable=["cache"]
    )

    def step(cache, ids):
      logits, variables = model.apply(
        {"params": p, "cache": cache},
        ids[:, None],
        method=Transformer.decode_step,
        mutable=["cache"],
      )
      return variables["cache"], logits

    _, logits = jax.lax.scan(step, variables["cache"], decoder_inputs.T)
    return jnp.swapaxes(logits, 0, 1)

  # Compiling dominates this file's run time; XLA's backend optimisation level changes how
  # fast the code runs, not the float32 arithmetic compared here.
  @functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
  def forward(p, i, t):
    logits = model.apply({"params": p}, i, t)
    encoded = model.apply({"params": p}, i, method=Transformer.encode)
    steps = incremental(p, i, encoded, shift_right(t)) if with_decoding else None
    return logits, encoded, steps

  return jax.tree_util.tree_map(
    lambda a: np.asarray(a, np.float64), forward(params, inputs, targets)
  )


@functools.cache
def _case(name):
  """(model, float32 params, batch, Flax (logits, encoded, decode-step logits or None),
  reference (logits, encoded))."""
  model = Transformer(TransformerConfig(**{**SMALL_MODEL, **CONFIGS[name]}))
  inputs, targets = _batch(model.config.vocab_size)
  params = _random_params(model, inputs, targets, seed=sorted(CONFIGS).index(name))
  flax_out = _flax_outputs(model, params, inputs, targets, name in DECODE_CHECKED)
  ref_out = numpy_transformer.transformer(
    numpy_transformer.to_float64(params), model.config, inputs, targets
  )
  return model, params, (inputs, targets), flax_out, ref_out


def _assert_close(actual, expected, mask, what):
  """float32 against float64: 1e-4 relative, with the absolute part on the array's scale."""
  actual, expected = actual[mask], expected[mask]
  scale = max(1.0, float(np.abs(expected).max()))
  np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * scale, err_msg=what)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_reference(name):
  _, _, (_, targets), (logits, _, _), (ref_logits, _) = _case(name)
  assert logits.shape == ref_logits.shape
  _assert_close(logits, ref_logits, targets != 0, f"{name}: logits at non-pad targets")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_encoder_output_matches_reference(name):
  _, _, (inputs, _), (_, encoded, _), (_, ref_encoded) = _case(name)
  assert encoded.shape == ref_encoded.shape
  _assert_close(encoded, ref_encoded, inputs != 0, f"{name}: encoder output at non-pad sources")


@pytest.mark.parametrize("name", DECODE_CHECKED)
def test_incremental_decoding_matches_reference(name):
  """init_cache + one decode_step per position gives the reference's teacher-forced logits
  at every non-pad target position."""
  _, _, (_, targets), (_, _, steps), (ref_logits, _) = _case(name)
  assert steps.shape == ref_logits.shape
  _assert_close(steps, ref_logits, targets != 0, f"{name}: decode_step logits")


def test_reference_attention_matches_elementwise_reference():
  """The vectorised eq. 1 of numpy_transformer against numpy_reference's loop version, with
  d_k != d_v and a ragged mask (one row fully masked)."""
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(2, 3, 2, 4)), rng.normal(size=(2, 5, 2, 4))
  v = rng.normal(size=(2, 5, 2, 3))
  allowed = rng.random((2, 1, 3, 5)) < 0.6
  allowed[0, 0, 1] = False
  out, weights = numpy_transformer.scaled_dot_product_attention(q, k, v, allowed)
  ref_out, ref_weights = numpy_reference.attention(q, k, v, allowed)
  np.testing.assert_allclose(weights, ref_weights, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
  has_key = np.broadcast_to(np.any(allowed, -1), weights.shape[:-1])
  np.testing.assert_allclose(weights.sum(-1), has_key.astype(np.float64), rtol=1e-12)


def test_reference_sees_no_pad_and_no_future():
  """The reference itself: more padding or different later targets leave the non-pad logits
  before them unchanged, so the Flax comparison exercises masks that matter."""
  model, params, (inputs, targets), _, (ref_logits, _) = _case("post-sinusoidal-shared")
  p = numpy_transformer.to_float64(params)
  keep = targets != 0
  longer = numpy_transformer.transformer(
    p, model.config, np.pad(inputs, ((0, 0), (0, 3))), np.pad(targets, ((0, 0), (0, 2)))
  )[0]
  np.testing.assert_allclose(longer[:, :6][keep], ref_logits[keep], rtol=1e-12, atol=1e-12)
  later = targets.copy()
  later[:, 2:] = np.where(later[:, 2:] == 0, 0, 5)
  changed = numpy_transformer.transformer(p, model.config, inputs, later)[0]
  np.testing.assert_allclose(changed[:, :3], ref_logits[:, :3], rtol=1e-12, atol=1e-12)
  assert np.abs(changed[:, 3:][keep[:, 3:]] - ref_logits[:, 3:][keep[:, 3:]]).max() > 1e-3
