"""The Flax Transformer: masking behaviour, caches, sizes, dtypes, and config validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.experiments import base, big
from t2t_jax.model import Transformer, TransformerConfig, decoding_params, shift_right
from t2t_jax.model.layers import OUTPUT_KERNEL
from tests.support import jit_apply, jit_init

TINY = TransformerConfig(
  vocab_size=50, d_model=32, d_ff=64, num_heads=4, num_layers=2, dropout_rate=0.0, max_len=32
)


def _random_batch(rng, batch, src_len, tgt_len, vocab=50, pad_from=None):
  inputs = rng.integers(4, vocab, size=(batch, src_len))
  targets = rng.integers(4, vocab, size=(batch, tgt_len))
  if pad_from is not None:
    for b, (s, t) in enumerate(pad_from):
      inputs[b, s:] = 0
      targets[b, t:] = 0
  return jnp.asarray(inputs, jnp.int32), jnp.asarray(targets, jnp.int32)


@pytest.fixture(scope="module")
def tiny_setup():
  model = Transformer(TINY)
  inputs, targets = _random_batch(np.random.default_rng(0), 2, 7, 6)
  params = jit_init(model, jax.random.PRNGKey(0), inputs, targets)
  apply = jax.jit(lambda p, i, t, *rest: model.apply({"params": p}, i, t, *rest))
  return model, params, apply


def test_shift_right():
  targets = jnp.array([[5, 6, 1, 7, 1, 0]])
  np.testing.assert_array_equal(shift_right(targets), [[2, 5, 6, 1, 7, 1]])
  seg = jnp.array([[1, 1, 1, 2, 2, 0]])
  np.testing.assert_array_equal(shift_right(targets, seg), [[2, 5, 6, 2, 7, 2]])


def test_decoder_is_causal(tiny_setup):
  _, params, apply = tiny_setup
  rng = np.random.default_rng(1)
  inputs, targets = _random_batch(rng, 2, 7, 6)
  base_logits = np.asarray(apply(params, inputs, targets))
  for t in range(6):
    changed = np.array(targets)
    # Decoder tokens after position t are targets[t:] (shifted right by one).
    changed[:, t:] = rng.integers(4, 50, size=changed[:, t:].shape)
    logits = np.asarray(apply(params, inputs, jnp.asarray(changed)))
    np.testing.assert_allclose(logits[:, : t + 1], base_logits[:, : t + 1], atol=1e-5)
    if t + 1 < 6:  # and the test can fail: later outputs do move
      assert np.abs(logits[:, t + 1 :] - base_logits[:, t + 1 :]).max() > 1e-4


def test_padding_does_not_leak(tiny_setup):
  _, params, apply = tiny_setup
  rng = np.random.default_rng(2)
  inputs, targets = _random_batch(rng, 2, 7, 6, pad_from=[(4, 3), (7, 6)])
  logits = np.asarray(apply(params, inputs, targets))
  # 1) More padding (different shapes) changes no real output.
  wide_in = jnp.pad(inputs, ((0, 0), (0, 5)))
  wide_tg = jnp.pad(targets, ((0, 0), (0, 3)))
  wide = np.asarray(apply(params, wide_in, wide_tg))
  np.testing.assert_allclose(wide[0, :3], logits[0, :3], atol=1e-5)
  np.testing.assert_allclose(wide[1, :6], logits[1, :6], atol=1e-5)
  # 2) Arbitrary content in positions marked as padding (segment 0) changes nothing real.
  seg_in = (np.asarray(inputs) != 0).astype(np.int32)
  seg_tg = (np.asarray(targets) != 0).astype(np.int32)
  junk_in = np.where(seg_in == 1, inputs, rng.integers(4, 50, size=inputs.shape))
  junk_tg = np.where(seg_tg == 1, targets, rng.integers(4, 50, size=targets.shape))
  packed = np.asarray(
    apply(
      params, jnp.asarray(junk_in), jnp.asarray(junk_tg), jnp.asarray(seg_in), jnp.asarray(seg_tg)
    )
  )
  np.testing.assert_allclose(packed[0, :3], logits[0, :3], atol=1e-5)
  np.testing.assert_allclose(packed[1], logits[1], atol=1e-5)
  # ... whereas the same junk without segment ids is real input and does change outputs.
  unmasked = np.asarray(apply(params, jnp.asarray(junk_in), jnp.asarray(junk_tg)))
  assert np.abs(unmasked[0, :3] - logits[0, :3]).max() > 1e-4


@pytest.mark.slow
def test_packed_row_equals_separate_pairs(tiny_setup):
  _, params, apply = tiny_setup
  rng = np.random.default_rng(3)
  (i1, t1), (i2, t2) = [_random_batch(rng, 1, s, t) for s, t in [(4, 3), (5, 4)]]
  row_in = jnp.concatenate([i1, i2, jnp.zeros((1, 2), jnp.int32)], axis=1)
  row_tg = jnp.concatenate([t1, t2, jnp.zeros((1, 1), jnp.int32)], axis=1)
  seg_in = jnp.array([[1] * 4 + [2] * 5 + [0] * 2])
  seg_tg = jnp.array([[1] * 3 + [2] * 4 + [0]])
  pos_in = jnp.array([list(range(4)) + list(range(5)) + [0, 0]])
  pos_tg = jnp.array([list(range(3)) + list(range(4)) + [0]])
  packed = apply(params, row_in, row_tg, seg_in, seg_tg, pos_in, pos_tg)
  alone1 = apply(params, i1, t1)
  alone2 = apply(params, i2, t2)
  np.testing.assert_allclose(packed[0, :3], alone1[0], atol=1e-5)
  np.testing.assert_allclose(packed[0, 3:7], alone2[0], atol=1e-5)


def _cached_decoding(model, length):
  """Jitted (start(params, inputs) -> cache, step(params, cache, ids) -> (logits, cache)):
  a decode cache of `length` positions and one decoder position at a time."""

  @jax.jit
  def start(params, inputs):
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
    _, variables = model.apply(
      {"params": params},
      encoded,
      inputs,
      length,
      method=Transformer.init_cache,
      mutable=["cache"],
    )
    return variables["cache"]

  @jax.jit
  def step(params, cache, ids):
    logits, variables = model.apply(
      {"params": params, "cache": cache}, ids, method=Transformer.decode_step, mutable=["cache"]
    )
    return logits, variables["cache"]

  return start, step


def _decode_as_teacher_forcing(model, params, inputs, targets, tolerance):
  """Decodes `targets` one position at a time from a cache, each step's logits within
  `tolerance` of the teacher-forced pass's; returns the cache after the last step."""
  full = jit_apply(model, {"params": params}, inputs, targets)
  start, step = _cached_decoding(model, targets.shape[1])
  cache = start(params, inputs)
  decoder_inputs = shift_right(targets)
  for t in range(targets.shape[1]):
    logits, cache = step(params, cache, decoder_inputs[:, t : t + 1])
    np.testing.assert_allclose(logits, full[:, t], atol=tolerance, rtol=tolerance)
  return cache


@pytest.mark.parametrize(
  "norm,positional,share", [("post", "sinusoidal", True), ("pre", "learned", False)]
)
def test_cached_decoding_matches_teacher_forcing(norm, positional, share):
  cfg = TINY.replace(norm=norm, positional=positional, share_embeddings=share)
  model = Transformer(cfg)
  rng = np.random.default_rng(4)
  inputs, targets = _random_batch(rng, 3, 7, 6, pad_from=[(3, 6), (7, 6), (5, 6)])
  params = jit_init(model, jax.random.PRNGKey(1), inputs, targets)
  _decode_as_teacher_forcing(model, params, inputs, targets, tolerance=1e-5)


def test_self_attention_caches_keep_each_position_on_its_slot_axis():
  """Keys are cached [batch, heads, d, length], values [batch, heads, length, d] (one
  position's values adjacent); `map_self_attention_cache` hands each its slot axis, so
  resizing and beam slots cut the positions, never d. After 3 of 6 steps, exactly the
  first 3 positions are written (what is written there: the teacher-forcing tests)."""
  from t2t_jax.model import map_self_attention_cache

  model = Transformer(TINY)
  inputs, targets = _random_batch(np.random.default_rng(5), 2, 7, 6)
  params = jit_init(model, jax.random.PRNGKey(2), inputs, targets)
  start, step = _cached_decoding(model, 6)
  cache = start(params, inputs)
  ids = shift_right(targets)
  for t in range(3):
    _, cache = step(params, cache, ids[:, t : t + 1])
  heads, d = TINY.num_heads, TINY.d_model // TINY.num_heads
  attn = cache["decoder"]["layer_0"]["self_attention"]
  assert attn["cached_key"].shape == (2, heads, d, 6)
  assert attn["cached_value"].shape == (2, heads, 6, d)
  assert np.abs(attn["cached_key"][..., :3]).min() > 0 and not attn["cached_key"][..., 3:].any()
  assert np.abs(attn["cached_value"][:, :, :3]).sum(-1).min() > 0
  assert not attn["cached_value"][:, :, 3:].any()
  axes = {}

  def record(x, axis):
    axes[x.shape] = axis
    return x[(slice(None),) * axis + (slice(0, 4),)]

  cut = map_self_attention_cache(cache, record)
  assert axes == {(2, heads, d, 6): 3, (2, heads, 6, d): 2}
  assert cut["decoder"]["layer_1"]["self_attention"]["cached_value"].shape == (2, heads, 4, d)
  assert cut["decoder"]["layer_1"]["self_attention"]["cached_key"].shape == (2, heads, d, 4)
  assert cut["decoder"]["layer_1"]["cross_attention"]["cross_key"].shape[:3] == (2, heads, d)


def _analytic_params(vocab, d_model, d_ff, layers_enc, layers_dec, shared=True, pre=False):
  """Parameters of the model, counted by hand from the paper's description."""
  mha = 4 * d_model * d_model + 3 * d_model  # W^Q, W^K, W^V, W^O; biases but on W^K
  ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
  ln = 2 * d_model
  enc = layers_enc * (mha + ffn + 2 * ln)
  dec = layers_dec * (2 * mha + ffn + 3 * ln)
  emb = vocab * d_model * (1 if shared else 3)
  final = 2 * ln if pre else 0
  return emb + enc + dec + final


def _count(cfg):
  x = jnp.ones((1, 4), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.PRNGKey(0), x, x))
  return sum(int(np.prod(l.shape)) for l in jax.tree.leaves(shapes["params"]))


@pytest.mark.parametrize("experiment,paper_millions", [(base, 65), (big, 213)])
def test_parameter_counts_match_table3(experiment, paper_millions):
  config = experiment.get_config()
  cfg = TransformerConfig.from_dict(config.model, vocab_size=37000)
  counted = _count(cfg)
  m = config.model
  analytic = _analytic_params(37000, m.d_model, m.d_ff, m.num_layers, m.num_layers)
  print(
    f"\n{experiment.__name__}: {counted:,} parameters "
    f"(analytic {analytic:,}; paper {paper_millions}M; "
    f"{100 * (counted / 1e6 / paper_millions - 1):+.2f}%)"
  )
  assert counted == analytic
  assert abs(counted / 1e6 - paper_millions) / paper_millions < 0.03


def test_separate_key_and_value_sizes():
  """Table 3 row B: d_k differs from d_model / h; W^O maps h * d_v back to d_model."""
  cfg = TINY.replace(d_k=3, d_v=5)
  x = jnp.ones((2, 4), jnp.int32)
  params = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.PRNGKey(0), x, x))["params"]
  attn = params["encoder"]["layer_0"]["self_attention"]
  assert attn["query"]["kernel"].shape == (32, 4, 3) and attn["key"]["kernel"].shape == (32, 4, 3)
  assert attn["value"]["kernel"].shape == (32, 4, 5) and attn["out"]["kernel"].shape == (4, 5, 32)
  d, h = 32, 4
  mha = 2 * d * h * 3 + h * 3 + d * h * 5 + h * 5 + h * 5 * d + d
  mha_default = 4 * d * d + 3 * d
  assert _count(cfg) == _count(TINY) + 3 * 2 * (mha - mha_default)  # 2 enc + 4 dec attentions


def test_parameter_count_variants():
  cfg = TINY.replace(norm="pre", share_embeddings=False, num_encoder_layers=3)
  # Separate matrices: source and target embeddings plus an output layer with bias.
  want = _analytic_params(50, 32, 64, 3, 2, shared=False, pre=True) + 50
  assert _count(cfg) == want
  learned = _count(TINY.replace(positional="learned"))
  assert learned == _count(TINY) + 2 * 32 * 32  # one table per stack, max_len x d_model


def test_reference_and_fused_attention_agree(tiny_setup):
  model, params, apply = tiny_setup
  inputs, targets = _random_batch(np.random.default_rng(5), 2, 7, 6, pad_from=[(4, 3), (7, 6)])
  fused = Transformer(TINY.replace(attention_impl="xla"))
  got = jit_apply(fused, {"params": params}, inputs, targets)
  np.testing.assert_allclose(got, apply(params, inputs, targets), atol=1e-5, rtol=1e-5)


def test_bfloat16_forward_close_to_float32(tiny_setup):
  """bf16 compute (float32 params): probabilities within 0.02 of float32 (8-bit mantissa)."""
  model, params, apply = tiny_setup
  inputs, targets = _random_batch(np.random.default_rng(6), 2, 7, 6, pad_from=[(4, 3), (7, 6)])
  bf16 = Transformer(TINY.replace(dtype="bfloat16"))
  got = jit_apply(bf16, {"params": params}, inputs, targets)
  assert got.dtype == jnp.float32
  p16, p32 = jax.nn.softmax(got), jax.nn.softmax(apply(params, inputs, targets))
  err = float(jnp.max(jnp.abs(p16 - p32)))
  print(f"\nbf16 vs float32: max |p16 - p32| = {err:.4f}")
  assert err < 0.02
  leaves = jax.tree.leaves(jax.eval_shape(bf16.init, jax.random.PRNGKey(0), inputs, targets))
  assert all(l.dtype == jnp.float32 for l in leaves)


def test_dropout_is_active_only_when_not_deterministic(tiny_setup):
  _, params, apply = tiny_setup
  model = Transformer(TINY.replace(dropout_rate=0.3, attention_dropout_rate=0.2))
  inputs, targets = _random_batch(np.random.default_rng(7), 2, 7, 6)
  det = jit_apply(model, {"params": params}, inputs, targets)
  np.testing.assert_allclose(det, apply(params, inputs, targets), atol=1e-5)
  dropped = _dropout_program(model, inputs, targets)
  run = lambda seed: dropped(params, jax.random.PRNGKey(seed))
  assert np.abs(run(0) - det).max() > 1e-3
  # The same key in a model and program built anew (as a resumed run rebuilds its step)
  # drops the same units: the masks come from the key alone, not from the program object.
  rebuilt = Transformer(TINY.replace(dropout_rate=0.3, attention_dropout_rate=0.2))
  again = _dropout_program(rebuilt, inputs, targets)(params, jax.random.PRNGKey(0))
  np.testing.assert_array_equal(again, run(0))
  assert np.abs(run(0) - run(1)).max() > 1e-3


def _dropout_program(model, inputs, targets):
  return jax.jit(
    lambda p, key: model.apply(
      {"params": p}, inputs, targets, deterministic=False, rngs={"dropout": key}
    )
  )


def test_attention_weights_are_exposed(tiny_setup):
  model, params, _ = tiny_setup
  inputs, targets = _random_batch(np.random.default_rng(8), 2, 7, 6, pad_from=[(4, 3), (7, 6)])
  _, state = jit_apply(model, {"params": params}, inputs, targets, mutable=["intermediates"])
  w = state["intermediates"]["encoder"]["layer_0"]["self_attention"]["attention_weights"][0]
  assert w.shape == (2, 4, 7, 7)
  np.testing.assert_allclose(np.asarray(w)[0, :, :4].sum(-1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(w)[0, :, :, 4:], 0.0)


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(d_model=30), "d_model=30 is not divisible by TransformerConfig.num_heads=4"),
    (dict(norm="middle"), "norm='middle': allowed values are 'post', 'pre'"),
    (dict(positional="rotary"), "positional='rotary': allowed values are 'sinusoidal', 'learned'"),
    (dict(dropout_rate=-0.1), r"dropout_rate=-0.1: must be in \[0, 1\)"),
    (dict(attention_dropout_rate=1.5), "attention_dropout_rate=1.5"),
    (dict(num_heads=0), "num_heads=0: must be a positive integer"),
    (dict(dtype="float33"), "dtype='float33' is not a dtype"),
    (dict(attention_impl="flash"), "attention_impl='flash': allowed values"),
  ],
)
def test_bad_config_names_the_field(change, message):
  with pytest.raises(ValueError, match=message):
    TINY.replace(**change)


def test_from_dict_rejects_unknown_fields():
  with pytest.raises(ValueError, match=r"unknown model config field\(s\) \['d_modle'\]"):
    TransformerConfig.from_dict({"d_modle": 8}, vocab_size=10)


def test_unknown_model_field_names_its_flag():
  with pytest.raises(ValueError, match=r"--config\.model\.d_modle"):
    TransformerConfig.from_dict({"d_modle": 8, "d_model": 16}, vocab_size=10)


def test_defaults_are_the_base_model_of_table3():
  cfg = TransformerConfig(vocab_size=37000)
  assert (cfg.num_layers, cfg.d_model, cfg.d_ff, cfg.num_heads) == (6, 512, 2048, 8)
  assert (cfg.key_dim, cfg.value_dim, cfg.dropout_rate) == (64, 64, 0.1)
  assert (cfg.encoder_layers, cfg.decoder_layers) == (6, 6)
  assert cfg.share_embeddings and cfg.positional == "sinusoidal" and cfg.norm == "post"


def test_too_long_sequence_is_an_error(tiny_setup):
  model, params, _ = tiny_setup
  x = jnp.ones((1, 40), jnp.int32)
  with pytest.raises(ValueError, match="exceeds TransformerConfig.max_len=32"):
    jit_apply(model, {"params": params}, x, x)


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_bfloat16_logits_are_accumulated_in_float32(share_embeddings):
  """With loss_chunk_tokens=0 the loss reads the model's logits: in a bfloat16 model they are
  the float32 products of the bfloat16 features and weights, not bfloat16-rounded ones."""
  cfg = TransformerConfig(
    vocab_size=64,
    d_model=32,
    d_ff=64,
    num_heads=4,
    num_layers=1,
    dropout_rate=0.0,
    max_len=16,
    dtype="bfloat16",
    loss_chunk_tokens=0,
    share_embeddings=share_embeddings,
  )
  model = Transformer(cfg)
  tokens = jnp.asarray(np.random.default_rng(3).integers(4, 64, size=(2, 9)), jnp.int32)
  params = jit_init(model, jax.random.PRNGKey(3), tokens, tokens)
  logits = jit_apply(model, {"params": params}, tokens, tokens)
  y, weights, bias = jit_apply(model, {"params": params}, tokens, tokens, features=True)
  assert logits.dtype == jnp.float32 and y.dtype == jnp.bfloat16
  w = weights.astype(jnp.bfloat16).astype(jnp.float32)
  want = jnp.einsum("...d,vd->...v", y.astype(jnp.float32), w)
  want = want if bias is None else want + bias
  np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)


def _dot_generals(jaxpr):
  """Every dot_general equation of a jaxpr, those of its inner jaxprs included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      yield eqn
    for value in eqn.params.values():
      for inner in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(inner, "jaxpr", inner)
        if hasattr(inner, "eqns"):
          yield from _dot_generals(inner)


def test_bfloat16_products_on_a_cpu_have_float32_outputs():
  """On a CPU every bfloat16 x bfloat16 product of a bfloat16 model, in the forward pass and
  in a decode step, writes float32 (layers._cpu_accumulation: XLA:CPU hands those to its
  bfloat16 kernels and runs bfloat16-output ones in float32). A Dense layer's values are the
  float64 product of its bfloat16-rounded input and kernel, rounded once to bfloat16."""
  from t2t_jax.model import layers

  model = Transformer(TINY.replace(dtype="bfloat16"))
  inputs, targets = _random_batch(np.random.default_rng(7), 2, 7, 6)
  params = jit_init(model, jax.random.PRNGKey(2), inputs, targets)
  cache = jax.eval_shape(_cached_decoding(model, 6)[0], params, inputs)
  passes = {
    "forward": jax.make_jaxpr(lambda p: model.apply({"params": p}, inputs, targets))(params),
    "decode step": jax.make_jaxpr(
      lambda p, c: model.apply(
        {"params": p, "cache": c},
        targets[:, :1],
        method=Transformer.decode_step,
        mutable=["cache"],
      )
    )(params, cache),
  }
  for name, closed in passes.items():
    bf16 = [
      e for e in _dot_generals(closed.jaxpr) if all(v.aval.dtype == jnp.bfloat16 for v in e.invars)
    ]
    assert len(bf16) >= 4 * TINY.num_layers, name  # the projections at least
    assert {e.outvars[0].aval.dtype for e in bf16} == {jnp.dtype(jnp.float32)}, name

  dense = layers._dense(TINY.replace(dtype="bfloat16"), 24, use_bias=False)
  x = jnp.asarray(np.random.default_rng(8).normal(size=(5, 32)), jnp.bfloat16)
  variables = dense.init(jax.random.PRNGKey(3), x)
  got = np.asarray(jax.jit(dense.apply)(variables, x), np.float64)
  kernel = variables["params"]["kernel"].astype(jnp.bfloat16)
  want = np.asarray(x, np.float64) @ np.asarray(kernel, np.float64)
  want = np.asarray(jnp.asarray(want, jnp.float32).astype(jnp.bfloat16), np.float64)
  np.testing.assert_allclose(got, want, rtol=2**-8, atol=0)


def test_a_bfloat16_model_decodes_with_float32_self_attention_caches_on_a_cpu():
  """On a CPU a bfloat16 model's self-attention caches are float32 (XLA:CPU would convert a
  bfloat16 cache in full to float32 and back at every step); what a step writes there is its
  bfloat16 keys and values, exactly, and cached decoding follows teacher forcing."""
  model = Transformer(TINY.replace(dtype="bfloat16"))
  inputs, targets = _random_batch(np.random.default_rng(9), 2, 7, 6)
  params = jit_init(model, jax.random.PRNGKey(4), inputs, targets)
  cache = _decode_as_teacher_forcing(model, params, inputs, targets, tolerance=0.05)
  written = [
    x
    for path, x in jax.tree_util.tree_leaves_with_path(cache)
    if getattr(path[-1], "key", None) in ("cached_key", "cached_value")
  ]
  assert len(written) == 2 * TINY.num_layers
  for x in written:
    assert x.dtype == jnp.float32
    assert np.count_nonzero(x) > 0
    np.testing.assert_array_equal(x, x.astype(jnp.bfloat16).astype(jnp.float32))


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decoding_params_compute_what_the_parameters_compute(dtype, share):
  """`decoding_params`: every kernel in the compute dtype with the values each product
  rounds it to, with shared embeddings the table's [d_model, vocab] copy for the
  pre-softmax product, every other leaf the parameters' own; the teacher-forced logits and
  every cached decode step's are the parameters' own, up to float32 summation order."""
  model = Transformer(TINY.replace(dtype=dtype, share_embeddings=share))
  inputs, targets = _random_batch(np.random.default_rng(11), 3, 7, 6)
  params = jit_init(model, jax.random.PRNGKey(5), inputs, targets)
  made = decoding_params(params, model.config)
  compute = jnp.dtype(dtype)
  kernels = 0
  for path, x in jax.tree_util.tree_leaves_with_path(params):
    got = made
    for key in path:
      got = got[key.key]
    if path[-1].key == "kernel":
      kernels += 1
      assert got.dtype == compute, path
      np.testing.assert_array_equal(got, x.astype(compute))
    else:
      assert got is x, path
  # per layer: the encoder's 4 attention and 2 feed-forward kernels, the decoder's 8 and 2
  assert kernels == 16 * TINY.num_layers + (not share)
  added = [
    (path, x)
    for path, x in jax.tree_util.tree_leaves_with_path(made)
    if path[-1].key == OUTPUT_KERNEL
  ]
  assert len(added) == share
  if share:
    (path, copy), table = added[0], params["embed"]["embedding"]
    assert [k.key for k in path] == ["embed", OUTPUT_KERNEL]
    assert copy.shape == (TINY.d_model, TINY.vocab_size) and copy.dtype == compute
    np.testing.assert_array_equal(copy, table.T.astype(compute))
    # the pre-softmax product reads the copy, not the table
    halved = {**made, "embed": {**made["embed"], OUTPUT_KERNEL: copy / 2}}
    np.testing.assert_allclose(
      jit_apply(model, {"params": halved}, inputs, targets),
      jit_apply(model, {"params": params}, inputs, targets) / 2,
      rtol=1e-6,
      atol=1e-6,
    )

  close = dict(rtol=1e-6, atol=1e-6)
  full = jit_apply(model, {"params": params}, inputs, targets)
  np.testing.assert_allclose(jit_apply(model, {"params": made}, inputs, targets), full, **close)
  start, step = _cached_decoding(model, targets.shape[1])
  cache, cache_made = start(params, inputs), start(made, inputs)
  for t, ids in enumerate(shift_right(targets).T):
    logits, cache = step(params, cache, ids[:, None])
    logits_made, cache_made = step(made, cache_made, ids[:, None])
    assert logits.dtype == logits_made.dtype == jnp.float32
    np.testing.assert_allclose(logits_made, logits, **close, err_msg=f"step {t}")
