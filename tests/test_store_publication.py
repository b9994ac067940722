"""The prepared store's publication: the manifest is inside the temporary directory when it is
renamed into place, temporaries carry the host's name and a killed preparation's are removed
by the next lock holder, two preparers never write one store (the second waits, then opens
the first's, or gives up naming the holder), sha256s in the manifest let `store.verify` find
a flipped byte, and the manifest's vocabulary hash is that of the bytes tokenized with."""

import hashlib
import json
import os
import threading

import pytest

from t2t_jax import data
from t2t_jax.data import prepare, store
from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.run import files, lock
from tests.test_data_store import _corpus, _textfiles_config


@pytest.fixture
def config(tmp_path):
  return _textfiles_config(_corpus(tmp_path / "corpus", n=200), data_dir=str(tmp_path / "shared"))


def test_the_manifest_is_inside_the_directory_renamed_into_place(tmp_path, config, monkeypatch):
  renamed = []
  real = os.rename

  def rename(src, dst):
    if os.path.basename(dst) == store.STORE_DIR:
      names = sorted(os.listdir(src))
      renamed.append((os.path.basename(src), names, store.read_manifest(type(tmp_path)(src))))
    real(src, dst)

  monkeypatch.setattr(os, "rename", rename)
  path = prepare.prepare(config, str(tmp_path / "w"))
  [(name, names, manifest)] = renamed
  assert name.startswith(f"prepared.tmp-{os.uname().nodename}-{os.getpid()}-")
  assert "manifest.json" in names and manifest is not None
  assert sorted(manifest["sha256"]) == sorted(set(names) - {"manifest.json"})
  assert manifest["sha256"]["train.inputs.npy"] == files.sha256_file(path / "train.inputs.npy")
  assert sorted(p.name for p in path.parent.iterdir()) == [
    "prepared",
    "prepared.lock",
    "vocab.model",
  ]


def test_verify_names_the_file_with_a_flipped_byte(tmp_path, config):
  path = prepare.prepare(config, str(tmp_path / "w"))
  assert store.verify(path) == []
  array = path / "dev.targets.npy"
  content = bytearray(array.read_bytes())
  content[-1] ^= 1  # same size: opening the store does not notice
  array.write_bytes(bytes(content))
  [damage] = store.verify(path)
  assert damage.startswith(f"{array}: sha256 ") and "where the manifest says" in damage
  (path / "test.jsonl").unlink()
  assert store.verify(path)[1] == f"{path / 'test.jsonl'}: missing"
  manifest = store.read_manifest(path)
  del manifest["sha256"]  # a store prepared before manifests kept them
  (path / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(data.DataError, match=r"made before stores kept sha256s, so its contents"):
    store.verify(path)


def test_the_next_lock_holder_removes_a_killed_preparations_temporary(tmp_path, config):
  shared = tmp_path / "shared"
  shared.mkdir()
  for name in ("prepared.tmp-otherhost-17-0123abcd", "prepared.tmp-4242-deadbeef"):
    (shared / name).mkdir()
    (shared / name / "train.inputs.npy").write_bytes(b"half")
  (shared / "unrelated.tmp-h-1-aa").mkdir()
  prepare.prepare(config, str(tmp_path / "w"))
  assert sorted(p.name for p in shared.iterdir()) == [
    "prepared",
    "prepared.lock",
    "unrelated.tmp-h-1-aa",
    "vocab.model",
  ]


def test_a_second_preparer_waits_then_opens_the_first_ones_store(tmp_path, config, monkeypatch):
  started, writes = threading.Event(), []
  real = prepare._write_arrays

  def slow_write(*args):
    writes.append(threading.current_thread().name)
    started.set()
    threading.Event().wait(1.0)  # the second preparer arrives meanwhile
    return real(*args)

  monkeypatch.setattr(prepare, "_write_arrays", slow_write)
  first = threading.Thread(target=prepare.prepare, args=(config, str(tmp_path / "run1")))
  first.start()
  assert started.wait(60)
  path = prepare.prepare(config, str(tmp_path / "run2"))  # takes the lock after the first
  first.join()
  assert writes == [first.name] and store.read_manifest(path) is not None


def test_a_second_preparer_gives_up_naming_the_holder(tmp_path, config):
  path = store.store_path(config, str(tmp_path / "w"))
  path.parent.mkdir(parents=True)
  config.wait_for_process0_s = 0.3
  with prepare.StoreLock(path), pytest.raises(lock.LockError) as e:
    prepare.prepare(config, str(tmp_path / "w"))
  text = str(e.value)
  assert "\n" not in text and f"{path} is being prepared by pid {os.getpid()} on host" in text
  assert f"lock file {path.parent / 'prepared.lock'}" in text and "data_dir elsewhere" in text
  assert not path.exists()


def test_the_manifest_records_the_hash_of_the_vocabulary_bytes_tokenized_with(
  tmp_path, config, monkeypatch
):
  """A vocabulary replaced after it was read must not be recorded for arrays it did not make."""
  w = str(tmp_path / "w")
  data.load_or_train_tokenizer(config, w)
  vocab = tokenizer_lib.vocab_path(config, w)
  used = hashlib.sha256(vocab.read_bytes()).hexdigest()
  real = prepare._write_split

  def replace_vocabulary_meanwhile(*args, **kwargs):
    vocab.write_bytes(b"another vocabulary")
    return real(*args, **kwargs)

  monkeypatch.setattr(prepare, "_write_split", replace_vocabulary_meanwhile)
  path = prepare.prepare(config, w)
  manifest = json.loads((path / "manifest.json").read_text())
  assert manifest["vocabulary"]["sha256"] == used
