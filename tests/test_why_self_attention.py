"""Why self-attention, measured (Table 1): the quick run, FLOP counts, path lengths, fits."""

import json
import math
import os

import jax
import numpy as np
import pytest

from t2t_jax.experiments import layer_timing as lt
from t2t_jax.experiments import why_self_attention as wsa

SPEC = lt.LayerSpec(d_model=16, num_heads=2, kernel=3, window=4)
PATH_NS = (4, 8, 32)  # measured in one pass at the longest; 32 = distance 31


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("why_self_attention")
  results, figures = wsa.run(
    str(out), SPEC, ns=[8, 16], path_ns=PATH_NS, repeats=1, log=lambda line: None
  )
  return str(out), results, figures


@pytest.mark.slow
def test_quick_run_writes_json_and_labelled_pngs(quick_run):
  out, results, figures = quick_run
  for name in ("why_self_attention.json", "time_vs_n.png", "path_length.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  with open(os.path.join(out, "why_self_attention.json"), encoding="utf-8") as f:
    saved = json.load(f)
  assert set(saved["timing"]) == set(lt.KINDS) and saved["fit_range"] == [8, 16]
  for kind in lt.KINDS:
    timing = saved["timing"][kind]
    assert timing["n"] == [8, 16] and all(t > 0 for t in timing["train_s"] + timing["decode_s"])
    assert set(saved["exponents"][kind]) == {"train", "decode", "train_flops", "decode_flops"}
  train_ax, decode_ax = figures["time_vs_n"].axes
  assert train_ax.get_xlabel() == decode_ax.get_xlabel() == "sequence length n"
  assert "time" in train_ax.get_ylabel() and "decode" in decode_ax.get_ylabel()
  legend = [t.get_text() for t in train_ax.get_legend().get_texts()]
  assert any(t.startswith("self-attention: n^") for t in legend), legend
  (path_ax,) = figures["path_length"].axes
  assert path_ax.get_xlabel() and "path length" in path_ax.get_ylabel()
  assert "O(n^2 d)" in wsa.table(results) and "O(log_k(n))" in wsa.table(results)


@pytest.mark.slow
def test_path_lengths_match_receptive_fields(quick_run):
  path = quick_run[1]["path"]
  assert path["n"] == list(PATH_NS)
  k, r = SPEC.kernel, SPEC.window
  for i, n in enumerate(PATH_NS):
    assert path["self_attention"]["min_layers"][i] == 1
    assert path["recurrent"]["min_layers"][i] == 1
    assert path["recurrent"]["path_length"][i] == n - 1  # sequential steps
    assert path["convolutional"]["min_layers"][i] == math.ceil((n - 1) / (k - 1))
    assert path["dilated"]["min_layers"][i] == math.ceil(math.log(n) / math.log(k))
    assert path["restricted"]["min_layers"][i] == math.ceil((n - 1) / (r - 1))
  assert path["convolutional"]["min_layers"][-1] == 16 and path["dilated"]["min_layers"][-1] == 4


def test_flop_counts_by_hand():
  n, d = 32, 16  # h = 2, d_k = d_v = 8; k = 3; r = 4
  projections = 4 * 2 * n * d * d
  assert lt.forward_flops("self_attention", n, SPEC) == projections + 2 * 2 * n * n * d == 131072
  assert lt.forward_flops("recurrent", n, SPEC) == 2 * n * 8 * d * d == 131072
  assert lt.forward_flops("convolutional", n, SPEC) == 2 * 3 * n * d * d == 49152
  assert lt.forward_flops("restricted", n, SPEC) == projections + 4 * n * 8 * d == 81920
  assert lt.forward_flops("restricted", n, SPEC, decode=True) == projections + 4 * n * 4 * d
  assert lt.forward_flops("restricted", 4, SPEC) == 4 * 2 * 4 * d * d + 4 * 4 * 4 * d
  assert lt.forward_flops("restricted", 2, SPEC, decode=True) == 4 * 2 * 2 * d * d + 4 * 2 * 4 * d
  assert lt.train_flops("convolutional", n, SPEC, batch=2) == 3 * 2 * 49152


def test_fit_exponent_recovers_known_growth():
  ns = lt.powers_of_two(8, 2048)
  assert ns[0] == 8 and ns[-1] == 2048 and len(ns) == 9
  assert lt.fit_exponent(ns, [3e-6 * n**2 for n in ns]) == pytest.approx(2.0)
  assert lt.fit_exponent(ns, [5e-3 * n for n in ns]) == pytest.approx(1.0)
  # A fixed overhead flattens the small-n end; fitting the top of the range recovers n^2.
  times = [1e-3 + 3e-7 * n**2 for n in ns]
  assert lt.fit_exponent(ns, times) < 1.5
  assert lt.fit_exponent(ns, times, n_min=256) == pytest.approx(2.0, abs=0.1)
  with pytest.raises(ValueError, match="need >= 2 points"):
    lt.fit_exponent(ns, times, n_min=4096)


@pytest.mark.parametrize("kind", lt.KINDS)
def test_decoding_one_position_at_a_time_matches_the_whole_sequence(kind):
  # 9 positions: restricted attention pads to blocks of r = 4 and crosses two block edges.
  layer = lt.make_layer(kind, SPEC)
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 9, SPEC.d_model))
  params = lt.init_params(kind, SPEC)
  whole = jax.jit(layer.forward)(params, x)
  stepped = jax.jit(lambda p, x: lt.decode_all(layer, p, x))(params, x)
  np.testing.assert_allclose(stepped, whole, atol=2e-5)
  # Causal: changing the last input changes no earlier output.
  changed = jax.jit(layer.forward)(params, x.at[:, -1].add(1.0))
  np.testing.assert_allclose(changed[:, :-1], whole[:, :-1], atol=1e-6)
