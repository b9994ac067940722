"""TFDS data sources read as pairs: the sources prepared through TFDS (WMT, text files) use
TensorFlow-free TFDS (`file_format='array_record'`), whose data sources give random access."""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

# The pipeline's split names -> TFDS's.
TFDS_SPLIT = {"train": "train", "dev": "validation", "test": "test"}


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


def _text(value: bytes | str) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)
