"""Test setup: 8 simulated CPU devices for pmap code (must precede the first jax import), the
`accelerator` marker's skip, and fixtures for the small model and training state."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

from tests import support


def pytest_collection_modifyitems(config, items):
  """Tests marked `accelerator` run only where JAX sees a GPU or TPU."""
  del config
  marked = [item for item in items if "accelerator" in item.keywords]
  if not marked:
    return
  import jax

  if jax.default_backend() == "cpu":
    skip = pytest.mark.skip(reason="needs a GPU or TPU")
    for item in marked:
      item.add_marker(skip)


@pytest.fixture
def small_model():
  """`support.small_model`: (model, params) of the small test Transformer, with overrides."""
  return support.small_model


@pytest.fixture
def small_state():
  """`support.small_state`: (model, TrainState) of the small test Transformer."""
  return support.small_state
