"""Preparing a TFDS translation source without minutes of silent retries when offline.

TFDS fetches the WMT archives with up to 10 retries per request under a growing back-off, so
a machine without network spends minutes before failing, and the failure does not say how to
proceed. Here the download hosts are probed first (a few seconds at most), each request is
retried at most twice, and any failure to obtain the archives stops with one message naming
the dataset and both ways forward: archives placed in TFDS's manual directory, or training
from local text files.
"""

import contextlib
import logging
import socket
import urllib.parse
from collections.abc import Iterator

import ml_collections
import tensorflow_datasets as tfds
from etils import epath

from t2t_jax.data.errors import DataError

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
