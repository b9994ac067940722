"""A workdir's chosen parameters kept in the compilation cache (`decoding.kept_params`): read back
equal to the checkpoints', made again whenever anything they depend on changes, never used
when damaged or of other shapes, and a warm process reads them without orbax."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2t_jax.decoding import kept_params
from t2t_jax.decoding.translator import TranslateError, Translator
from tests import support


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  """A compilation cache directory of the test's own, as `compilation.directory()`."""
  directory = str(tmp_path / "cache")
  os.makedirs(directory)
  monkeypatch.setattr(kept_params.compilation, "directory", lambda: directory)
  return directory


def _copy(tmp_path, name="w") -> str:
  return shutil.copytree(support.small_trained_workdir(), str(tmp_path / name))


def _leaves_equal(a, b) -> None:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.asarray(x).dtype == np.asarray(y).dtype


class _Restores:
  """loading.read_params's orbax side, counted."""

  def __init__(self, monkeypatch):
    from t2t_jax.run import checkpoint

    self.calls = 0
    self.real = real = checkpoint.load_params

    def counted(*args, **kwargs):
      self.calls += 1
      return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "load_params", counted)


def test_a_second_load_reads_the_kept_entry_equal_to_the_checkpoint(
  tmp_path, cache_dir, monkeypatch
):
  workdir = _copy(tmp_path)
  restores = _Restores(monkeypatch)
  first = Translator.from_workdir(workdir, "average:2", "float32")
  assert restores.calls == 1
  (entry,) = [n for n in os.listdir(cache_dir) if n.startswith(kept_params.PREFIX)]
  assert entry.endswith(kept_params.compilation.ENTRY_SUFFIX)  # bounded by compilation.trim
  second = Translator.from_workdir(workdir, "average:2", "float32")
  assert restores.calls == 1  # read from the entry
  _leaves_equal(first.params, second.params)
  assert second.checkpoint_steps == first.checkpoint_steps == [3, 6]
  direct, _ = restores.real(workdir, "average:2", None)
  _leaves_equal(direct, second.params)
  assert second.translate(["a b c"]) == first.translate(["a b c"])
  Translator.from_workdir(workdir, "latest", "float32")  # another choice: another entry
  assert restores.calls == 2


def test_the_key_changes_with_every_input_of_the_choice(tmp_path):
  workdir = _copy(tmp_path)
  shapes = {"a": jax.ShapeDtypeStruct((2, 3), np.float32)}
  key = lambda spec="latest", like=shapes: kept_params.key(workdir, spec, like)
  base = key()
  assert key() == base  # nothing changed
  assert key("average:2") != base
  assert key(like={"a": jax.ShapeDtypeStruct((2, 4), np.float32)}) != base
  assert key(like={"a": jax.ShapeDtypeStruct((2, 3), np.float16)}) != base
  ckpt = os.path.join(workdir, "checkpoints")
  steps = sorted(os.listdir(ckpt), key=lambda s: int(s) if s.isdigit() else -1)
  changes = []

  def changed(what):
    nonlocal base
    now = key()
    changes.append((what, now != base))
    base = now

  # a file rewritten in place (same size), one added, a step removed, a step renamed
  victim = next(
    os.path.join(r, f) for r, _, fs in os.walk(os.path.join(ckpt, steps[-1])) for f in fs
  )
  data = open(victim, "rb").read()
  os.utime(victim, ns=(0, 0))
  changed("mtime")
  with open(victim, "wb") as f:
    f.write(data)
  changed("rewritten")
  open(os.path.join(ckpt, steps[-1], "extra"), "w").close()
  changed("file added")
  shutil.rmtree(os.path.join(ckpt, steps[0]))
  changed("step removed")
  os.rename(os.path.join(ckpt, steps[-1]), os.path.join(ckpt, "60"))
  changed("step renamed")
  with open(os.path.join(workdir, "selected.json"), "w") as f:
    json.dump({"checkpoint": "latest"}, f)
  changed("selection")
  with open(os.path.join(workdir, "best.json"), "w") as f:
    json.dump({"metric": "bleu", "best": []}, f)
  changed("best record")
  moved = shutil.copytree(workdir, str(tmp_path / "moved"))
  assert kept_params.key(moved, "latest", shapes) != base
  assert [what for what, differs in changes if not differs] == []


def test_a_damaged_or_foreign_entry_is_made_again(tmp_path, cache_dir, monkeypatch):
  workdir = _copy(tmp_path)
  restores = _Restores(monkeypatch)
  good = Translator.from_workdir(workdir, "latest", "float32").params
  (name,) = [n for n in os.listdir(cache_dir) if n.startswith(kept_params.PREFIX)]
  path = os.path.join(cache_dir, name)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)
  again = Translator.from_workdir(workdir, "latest", "float32").params
  assert restores.calls == 2
  _leaves_equal(good, again)
  assert Translator.from_workdir(workdir, "latest", "float32") and restores.calls == 2
  # an entry of other shapes under this name (a collision, a hand-made file): not used
  digest = name[len(kept_params.PREFIX) : -len(kept_params.compilation.ENTRY_SUFFIX)]
  kept_params.write(cache_dir, digest, kept_params.Kept({"x": np.zeros(3)}, [6], [None]))
  again = Translator.from_workdir(workdir, "latest", "float32").params
  assert restores.calls == 3
  _leaves_equal(good, again)


def test_entries_are_not_kept_past_their_bound_or_without_a_cache(tmp_path, cache_dir, monkeypatch):
  big = kept_params.Kept({"w": np.zeros(8, np.float32)}, [1], [None])
  monkeypatch.setattr(kept_params, "MAX_KEPT_BYTES", 16)
  assert not kept_params.write(cache_dir, "a" * 64, big)
  monkeypatch.setattr(kept_params, "MAX_KEPT_BYTES", 32)
  assert kept_params.write(cache_dir, "a" * 64, big)
  assert not kept_params.write(
    cache_dir, "b" * 64, kept_params.Kept({"a/b": np.zeros(1)}, [1], [None])
  )
  monkeypatch.setattr(kept_params.compilation, "directory", lambda: None)
  calls = []
  kept, hit = kept_params.load("w", "latest", {}, lambda: calls.append(1) or big)
  assert (kept, hit, calls) == (big, False, [1])


def test_the_vocabulary_is_checked_against_the_kept_fingerprints(tmp_path, cache_dir):
  workdir = _copy(tmp_path)
  Translator.from_workdir(workdir, "latest", "float32")  # kept, with the fingerprints
  vocab = os.path.join(workdir, "vocab.symbols")
  lines = open(vocab).read().splitlines()
  with open(vocab, "w") as f:  # same size, two symbols swapped
    f.write("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
  with pytest.raises(TranslateError, match=rf"vocabulary {vocab} \(sha256 [0-9a-f]{{64}}\) is not"):
    Translator.from_workdir(workdir, "latest", "float32")


def test_a_warm_process_loads_a_workdir_without_orbax(tmp_path):
  workdir = _copy(tmp_path)
  code = (
    "import sys\n"
    "from t2t_jax import compilation\n"
    f"compilation.enable({str(tmp_path / 'cache')!r})\n"
    "from t2t_jax.decoding.translator import Translator\n"
    f"t = Translator.from_workdir({workdir!r}, 'latest', 'float32')\n"
    "print(sorted(m for m in sys.modules if m.split('.')[0] in ('orbax', 'sacrebleu')))\n"
  )
  env = dict(os.environ)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  run = lambda: subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
  ).stdout.strip()
  assert run() != "[]"  # the first reads the checkpoint through orbax
  assert run() == "[]"
