"""tools/int8_ab.py: its int8 layer against a float64 numpy reference, and its product
timings checked against numpy's exact integer product."""

import numpy as np

from tools import int8_ab


def test_quantized_product_is_the_float_product_within_int8_rounding():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((7, 32)).astype(np.float32)
  w = rng.standard_normal((32, 11)).astype(np.float32)
  kernel, scale = int8_ab.quantize_columns(w)
  assert kernel.dtype == np.int8 and np.abs(kernel).max() == 127
  np.testing.assert_allclose(kernel * scale, w, atol=float(scale.max()) / 2 + 1e-7)
  got = np.asarray(int8_ab.quantized_product(x, kernel, scale), np.float64)
  exact = x.astype(np.float64) @ w.astype(np.float64)
  # each factor is off by at most half a step: |x| max / 254 and |w| max / 254 per entry
  bound = 32 * (np.abs(x).max(1, keepdims=True) / 254 * np.abs(w).max(0) * 2.01)
  assert np.all(np.abs(got - exact) <= bound)
  assert np.abs(got - exact).max() > 0  # it is the int8 product, not the float one


def test_products_checks_int8_against_numpy_and_times_each(monkeypatch):
  monkeypatch.setattr(int8_ab, "SHAPES", ((3, 8, 5),))
  (row,) = int8_ab.products(repeats=2)
  assert row["shape"] == (3, 8, 5)
  assert all(row[k] > 0 for k in ("float32_ms", "int8_ms", "quantized_ms"))
