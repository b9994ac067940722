"""Where (source, target) text pairs come from: TFDS (WMT, local text files), synthetic, or a
treebank (`t2t_jax.data.treebank`, parsing).

Everything goes through TensorFlow-free TFDS (`file_format='array_record'`, data sources with
random access) except the synthetic tasks, which are generated in memory because writing a
generated set to disk would only add a prepare step. All sources expose the same small
`PairSource` interface: `len()` and `read(indices) -> [(source_text, target_text), ...]`.
"""

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import ml_collections
import tensorflow_datasets as tfds
from etils import epath

from t2t_jax.data import config as config_lib
from t2t_jax.data import download, synthetic, textio
from t2t_jax.data.errors import DataError

SPLITS = ("train", "dev", "test")
_TFDS_SPLIT = {"train": "train", "dev": "validation", "test": "test"}


class PairSource(Protocol):
  """Random access to the (source_text, target_text) pairs of one split."""

  def __len__(self) -> int: ...

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]: ...


class ListPairs:
  """Pairs held in memory (synthetic tasks)."""

  def __init__(self, pairs: list[tuple[str, str]]):
    self._pairs = pairs

  def __len__(self) -> int:
    return len(self._pairs)

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    return [self._pairs[i] for i in indices]


class RecordSource(Protocol):
  """What `builder.as_data_source(split)` returns: records by index, several at once."""

  def __len__(self) -> int: ...

  def __getitem__(self, index: int) -> Mapping[str, Any]: ...

  def __getitems__(self, indices: Sequence[int]) -> Sequence[Mapping[str, Any]]: ...


class TfdsPairs:
  """A TFDS data source whose records hold the two sides under `source_key`/`target_key`."""

  def __init__(self, data_source: RecordSource, source_key: str, target_key: str) -> None:
    self._ds = data_source
    self._keys = (source_key, target_key)

  def __len__(self) -> int:
    return len(self._ds)

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    try:
      records = self._ds.__getitems__(list(indices))  # one batched array_record read
    except TypeError:  # tfds.testing.mock_data's sources only support item access
      records = [self._ds[i] for i in indices]
    return [(_text(r[self._keys[0]]), _text(r[self._keys[1]])) for r in records]


class HeadPairs:
  """The first `n` pairs of another source."""

  def __init__(self, source: PairSource, n: int):
    self._source = source
    self._n = min(n, len(source))

  def __len__(self) -> int:
    return self._n

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    return self._source.read(indices)


def _text(value: bytes | str) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class Textfiles(tfds.core.GeneratorBasedBuilder):
  """Any local parallel corpus, given as pairs of aligned plain-text files per split.

  The config name is a fingerprint of the files' content, so an edited corpus is prepared
  again instead of being read stale. Examples keep file order (shuffling is
  disabled) and include empty lines, which the pipeline skips and counts, never shifting
  alignment. Validation (line counts, UTF-8) happens while preparing, before any training.
  """

  VERSION = tfds.core.Version("1.0.0")

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> None:
    # No checksums or metadata files live beside this code. (TFDS's lookup of them needs the
    # `importlib_resources` package for builders defined inside a package.)
    return None

  def __init__(self, *, files: dict[str, tuple[str, str]], **kwargs: Any) -> None:
    self._files = files
    name = "files_" + _fingerprint(files)
    super().__init__(config=tfds.core.BuilderConfig(name=name), **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    features = {"source": tfds.features.Text(), "target": tfds.features.Text()}
    return tfds.core.DatasetInfo(
      builder=self,
      description="Aligned local text files: " + json.dumps(self._files),
      features=tfds.features.FeaturesDict(features),
      supervised_keys=("source", "target"),
      disable_shuffling=True,
    )

  def _split_generators(
    self, dl_manager: tfds.download.DownloadManager
  ) -> dict[str, Iterator[tuple[int, dict[str, str]]]]:
    del dl_manager  # local files only
    # Read (and so validate) every split before anything is written.
    pairs = {
      split: textio.read_parallel(*paths, split=split) for split, paths in self._files.items()
    }
    return {_TFDS_SPLIT[split]: self._generate_examples(p) for split, p in pairs.items()}

  def _generate_examples(
    self, pairs: Iterable[tuple[str, str]]
  ) -> Iterator[tuple[int, dict[str, str]]]:
    for i, (source, target) in enumerate(pairs):
      yield i, {"source": source, "target": target}


def _fingerprint(files: dict[str, tuple[str, str]]) -> str:
  """A digest of the corpus CONTENT, so an edited file is prepared again while a copy or a
  `touch` is not, and every host of a multi-host job names the same prepared dataset."""
  digest = hashlib.sha256()
  for split, paths in sorted(files.items()):
    for side, path in zip(("source", "target"), paths):
      digest.update(f"{split}_{side}:".encode())
      digest.update(_file_digest(path, f"{split}_{side}"))
  return digest.hexdigest()[:16]


def _file_digest(path: str, flag: str) -> bytes:
  p = epath.Path(path)
  try:
    if p.is_dir():
      raise IsADirectoryError(21, "is a directory")
    digest = hashlib.sha256()
    with p.open("rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.digest()
  except FileNotFoundError:
    raise DataError(f"{path}: no such file (config.data.{flag})") from None
  except OSError as e:
    raise DataError(f"{path}: cannot read: {e.strerror or e} (config.data.{flag})") from None


def open_splits(
  c: ml_collections.ConfigDict, workdir: str, *, process_index: int = 0
) -> dict[str, PairSource | None]:
  """Returns {'train', 'dev', 'test'} -> PairSource (None where the source has no such split)."""
  splits = _open_splits(c, workdir, process_index)
  if c.train_max_pairs:
    splits["train"] = HeadPairs(splits["train"], c.train_max_pairs)
  return splits


def _open_splits(
  c: ml_collections.ConfigDict, workdir: str, process_index: int
) -> dict[str, PairSource | None]:
  if c.source == "synthetic":
    return {split: ListPairs(synthetic.pairs(c, split)) for split in SPLITS}
  if c.source == "treebank":
    from t2t_jax.data import treebank  # imports this module

    return treebank.open_splits(c)
  if c.source == "textfiles":
    files = {
      split: (c[f"{split}_source"], c[f"{split}_target"])
      for split in SPLITS
      if c[f"{split}_source"]
    }
    data_dir = c.tfds_data_dir or str(epath.Path(config_lib.data_root(c, workdir)) / "tfds")
    builder = Textfiles(files=files, data_dir=data_dir, file_format="array_record")
    _prepare(builder, c, process_index)
    return {
      split: (
        TfdsPairs(builder.as_data_source(split=_TFDS_SPLIT[split]), "source", "target")
        if split in files
        else None
      )
      for split in SPLITS
    }
  return _open_wmt(c, process_index)


def _open_wmt(c: ml_collections.ConfigDict, process_index: int) -> dict[str, PairSource]:
  # Registers the wmt* builders; imported only when WMT is asked for.
  import tensorflow_datasets.translate  # noqa: F401 (registers the wmt builders)

  source_lang, target_lang = languages(c)
  builder = tfds.builder(
    f"{c.source}/{c.pair}", data_dir=c.tfds_data_dir or None, file_format="array_record"
  )
  try:
    _prepare(builder, c, process_index)
  except ModuleNotFoundError as e:
    if e.name != "importlib_resources":
      raise
    # tensorflow-datasets 4.9 imports it when preparing its packaged builders.
    raise DataError(
      f"preparing {builder.info.full_name} needs the importlib_resources "
      "package: pip install importlib_resources"
    ) from None
  return {
    split: TfdsPairs(builder.as_data_source(split=_TFDS_SPLIT[split]), source_lang, target_lang)
    for split in SPLITS
  }


def tfds_identity(
  c: ml_collections.ConfigDict, splits: dict[str, PairSource | None]
) -> dict[str, Any]:
  """Names a prepared TFDS source in a store manifest: dataset, version, direction, splits."""
  builder = tfds.builder(
    f"{c.source}/{c.pair}", data_dir=c.tfds_data_dir or None, file_format="array_record"
  )
  source_lang, target_lang = languages(c)
  return dict(
    name=c.source,
    pair=c.pair,
    version=str(builder.info.version),
    source_lang=source_lang,
    target_lang=target_lang,
    splits={
      split: dict(tfds_split=_TFDS_SPLIT[split], examples=len(source))
      for split, source in splits.items()
      if source is not None
    },
  )


def languages(c: ml_collections.ConfigDict) -> tuple[str, str]:
  """(source, target) language of a WMT pair; by default English -> the other language."""
  pair = c.pair.split("-")
  source = c.source_lang or "en"
  target = c.target_lang or next((lang for lang in pair if lang != source), "")
  if len(pair) != 2 or sorted((source, target)) != sorted(pair):
    raise DataError(
      f"config.data.source_lang={c.source_lang!r}/target_lang={c.target_lang!r} "
      f"do not match config.data.pair={c.pair!r}"
    )
  return source, target


def _prepare(
  builder: tfds.core.DatasetBuilder, c: ml_collections.ConfigDict, process_index: int
) -> None:
  """Process 0 downloads/prepares; the others wait for it (the data dir must be shared)."""
  if builder.is_prepared():
    return
  if process_index == 0:
    if c.source == "textfiles":
      builder.download_and_prepare()
      return
    if not c.tfds_download:
      raise DataError(
        f"{builder.info.full_name} is not prepared in {builder.data_dir} and "
        "config.data.tfds_download=False"
      )
    download.download_and_prepare(builder, c)
    return
  wait_for(
    builder.is_prepared, f"{builder.info.full_name} in {builder.data_dir}", c.wait_for_process0_s
  )


def wait_for(ready: Callable[[], bool], what: str, timeout_s: float) -> None:
  """Polls `ready()` until true; raises DataError after `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  logging.info("Waiting for process 0 to write %s", what)
  while not ready():
    if time.monotonic() > deadline:
      raise DataError(
        f"gave up after {timeout_s}s waiting for process 0 to write {what}; "
        "the workdir (or config.data.data_dir) and tfds_data_dir must be shared by all "
        "processes"
      )
    time.sleep(1.0)
