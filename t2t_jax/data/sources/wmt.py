"""The WMT sources (`wmt14_translate`, `wmt17_translate`): TFDS's translation datasets, which
download only when selected, prepared without minutes of silent retries when offline.

TFDS fetches the WMT archives with up to 10 retries per request under a growing back-off, so
a machine without network spends minutes before failing, and the failure does not say how to
proceed. Here the download hosts are probed first (a few seconds at most), each request is
retried at most twice, and any failure to obtain the archives stops with one message naming
the dataset and both ways forward: archives placed in TFDS's manual directory, or training
from local text files.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import socket
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import ml_collections
from etils import epath

from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import base
from t2t_jax.data.sources.tfds_pairs import TFDS_SPLIT, TfdsPairs

if TYPE_CHECKING:  # imported where used: a process that reads no WMT data never pays for it
  import tensorflow_datasets as tfds

_RETRIES = 2  # per request, instead of TFDS's 10 with back-off
_PORTS = {"http": 80, "https": 443, "ftp": 21}


def offline_message(
  builder: tfds.core.DatasetBuilder, c: ml_collections.ConfigDict, reason: str
) -> str:
  """The one-line message of a TFDS source that cannot be downloaded."""
  manual = c.tfds_manual_dir or str(builder.data_path.parent.parent.parent / "downloads" / "manual")
  return (
    f"cannot download {builder.info.full_name} ({reason}); either place its archives in "
    f"{manual} (config.data.tfds_manual_dir, TFDS's manual_dir) and run again, or train "
    "from local text files: --config.data.source=textfiles "
    "--config.data.train_source=FILE --config.data.train_target=FILE "
    "--config.data.dev_source=FILE --config.data.dev_target=FILE "
    "[--config.data.test_source=FILE --config.data.test_target=FILE]"
  )


def download_urls(builder: tfds.core.DatasetBuilder) -> list[str]:
  """The archive URLs a WMT builder would fetch (those not listed for manual download)."""
  from tensorflow_datasets.translate import wmt

  source = builder.builder_config.language_pair[0]
  urls = []
  for name in sorted({n for names in builder.subsets.values() for n in names}):
    dataset = wmt.DATASET_MAP[name]
    if not dataset.get_manual_dl_files(source):
      urls.extend(dataset.get_url(source))
  return urls


def probe(urls: list[str], timeout_s: float) -> str | None:
  """None when a TCP connection opens to every host of `urls`, else why not."""
  hosts = sorted(
    {
      (u.hostname, u.port or _PORTS.get(u.scheme, 80))
      for u in map(urllib.parse.urlsplit, urls)
      if u.hostname
    }
  )
  for host, port in hosts:
    try:
      socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
      return f"{host}:{port} unreachable: {e.strerror or e}"
  return None


@contextlib.contextmanager
def _few_retries() -> Iterator[None]:
  """Bounds TFDS's per-request retries (a module constant it reads at each request)."""
  from tensorflow_datasets.core.download import downloader

  previous = downloader.MAX_RETRIES
  downloader.MAX_RETRIES = min(previous, _RETRIES)
  try:
    yield
  finally:
    downloader.MAX_RETRIES = previous


def _manual_files(c: ml_collections.ConfigDict) -> bool:
  manual = c.tfds_manual_dir
  if not manual:
    return False
  try:
    return any(epath.Path(manual).iterdir())
  except OSError:
    return False


def download_and_prepare(builder: tfds.core.DatasetBuilder, c: ml_collections.ConfigDict) -> None:
  """builder.download_and_prepare(), failing within seconds when the archives cannot be had."""
  if c.download_probe_s > 0 and not _manual_files(c):
    try:
      urls = download_urls(builder)
    except (AttributeError, KeyError, TypeError) as e:  # not a WMT builder
      logging.info("no download hosts to probe for %s: %s", builder.info.full_name, e)
      urls = []
    reason = probe(urls, c.download_probe_s)
    if reason:
      raise DataError(offline_message(builder, c, reason))
  import tensorflow_datasets as tfds

  config = tfds.download.DownloadConfig(
    manual_dir=c.tfds_manual_dir or None, try_download_gcs=False
  )
  with _few_retries():
    try:
      builder.download_and_prepare(download_config=config)
    except DataError:
      raise
    except Exception as e:  # requests, urllib3, TFDS DownloadError, a missing manual archive
      if not _is_download_error(e):
        raise
      raise DataError(offline_message(builder, c, f"{type(e).__name__}: {e}"[:300])) from e


def _is_download_error(e: BaseException) -> bool:
  """Failures to obtain the archives (not, say, a full disk while preparing them)."""
  import requests
  import tensorflow_datasets as tfds

  if isinstance(e, AssertionError):  # WMT's check for archives listed for manual download
    return "manually download" in str(e)
  return isinstance(
    e,
    (
      ConnectionError,
      TimeoutError,
      socket.gaierror,
      requests.RequestException,
      tfds.download.DownloadError,
    ),
  )


# ----------------------------------------------------------------------------- the source


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


def _builder(name: str, c: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  import tensorflow_datasets as tfds

  return tfds.builder(
    f"{name}/{c.pair}", data_dir=c.tfds_data_dir or None, file_format="array_record"
  )


def _download(builder: tfds.core.DatasetBuilder, c: ml_collections.ConfigDict) -> None:
  """Process 0's preparation: only where config.data.tfds_download allows it."""
  if not c.tfds_download:
    raise DataError(
      f"{builder.info.full_name} is not prepared in {builder.data_dir} and "
      "config.data.tfds_download=False"
    )
  try:
    download_and_prepare(builder, c)
  except ModuleNotFoundError as e:
    if e.name != "importlib_resources":
      raise
    # tensorflow-datasets 4.9 imports it when preparing its packaged builders.
    raise DataError(
      f"preparing {builder.info.full_name} needs the importlib_resources "
      "package: pip install importlib_resources"
    ) from None


class Wmt(base.Source):
  """One WMT release through TFDS, in the direction of source_lang/target_lang."""

  needs_download = True

  def __init__(self, name: str) -> None:
    self.name = name

  def validate(self, c: ml_collections.ConfigDict) -> None:
    languages(c)  # the direction must be the pair's, before anything is downloaded

  def open_splits(
    self, c: ml_collections.ConfigDict, workdir: str, process_index: int
  ) -> base.Splits:
    import tensorflow_datasets.translate  # noqa: F401 (registers the wmt builders, slow)

    source_lang, target_lang = languages(c)
    builder = _builder(self.name, c)
    base.prepare_once(
      builder.is_prepared,
      lambda: _download(builder, c),
      f"{builder.info.full_name} in {builder.data_dir}",
      process_index,
      c.wait_for_process0_s,
    )
    return {
      split: TfdsPairs(builder.as_data_source(split=TFDS_SPLIT[split]), source_lang, target_lang)
      for split in base.SPLITS
    }

  def identity(self, c: ml_collections.ConfigDict, splits: base.Splits) -> dict[str, Any]:
    """Dataset, version, direction and split sizes."""
    source_lang, target_lang = languages(c)
    return dict(
      name=self.name,
      pair=c.pair,
      version=str(_builder(self.name, c).info.version),
      source_lang=source_lang,
      target_lang=target_lang,
      splits={
        split: dict(tfds_split=TFDS_SPLIT[split], examples=len(pairs))
        for split, pairs in splits.items()
        if pairs is not None
      },
    )

  def train_identity(
    self, c: ml_collections.ConfigDict, identity: dict[str, Any]
  ) -> dict[str, Any]:
    """Dataset, version, direction and the training split's size."""
    out = {k: v for k, v in identity.items() if k != "splits"}
    out["train"] = identity["splits"].get("train")
    return out

  def check_identity(
    self, path: pathlib.Path, recorded: dict[str, Any], c: ml_collections.ConfigDict
  ) -> None:
    source_lang, target_lang = languages(c)
    base.check_fields(
      path, recorded, dict(pair=c.pair, source_lang=source_lang, target_lang=target_lang)
    )

  def describe_test_set(self, data: Mapping[str, Any], pair: str) -> tuple[str, str]:
    """The paper's test set: Table 2 reports newstest2014."""
    return "newstest2014", pair


base.register(Wmt("wmt14_translate"))
base.register(Wmt("wmt17_translate"))
