"""A TFDS source that cannot be downloaded stops at once with one message saying how to go on.

The network is made unreachable for the process by replacing the connection (probe) and the
download functions with ones that raise; nothing here waits for a real time-out.
"""

import socket

import pytest
import requests
import tensorflow_datasets as tfds

from t2t_jax import data
from t2t_jax.data.sources import wmt

HOW_TO_PROCEED = (
  r"cannot download wmt14_translate/de-en/1\.0\.0 \(.*\); either place its "
  r"archives in .*manual \(config\.data\.tfds_manual_dir, TFDS\'s manual_dir\)"
  r".*or train from local text files: --config\.data\.source=textfiles "
  r"--config\.data\.train_source=FILE --config\.data\.train_target=FILE"
)


def _config(tmp_path, **overrides):
  c = data.default_config()
  c.update(
    source="wmt14_translate", pair="de-en", tfds_data_dir=str(tmp_path / "tfds"), vocab_size=300
  )
  c.update(overrides)
  return c


def test_unreachable_download_hosts_stop_with_one_message(tmp_path, monkeypatch):
  tried = []

  def unreachable(address, timeout=None):
    tried.append((address, timeout))
    raise socket.gaierror(-3, "Temporary failure in name resolution")

  monkeypatch.setattr(socket, "create_connection", unreachable)
  monkeypatch.setattr(
    tfds.core.DatasetBuilder,
    "download_and_prepare",
    lambda *a, **k: pytest.fail("downloaded although unreachable"),
  )
  with pytest.raises(data.DataError, match=HOW_TO_PROCEED) as e:
    data.get_datasets(_config(tmp_path, download_probe_s=1.5), str(tmp_path / "w"))
  assert "statmt.org:80 unreachable: Temporary failure in name resolution" in str(e.value)
  assert "\n" not in str(e.value)
  assert tried and all(timeout == 1.5 for _, timeout in tried)
  assert not (tmp_path / "w" / "prepared").exists()


@pytest.mark.parametrize(
  "failure",
  [
    requests.ConnectionError("[Errno 101] Network is unreachable"),
    tfds.download.DownloadError("Failed to get url http://www.statmt.org/x.tgz. HTTP code: 503."),
  ],
)
def test_a_failing_download_stops_with_one_message(tmp_path, monkeypatch, failure):
  from tensorflow_datasets.core.download import downloader

  monkeypatch.setattr(wmt, "probe", lambda urls, timeout_s: None)  # hosts "reachable"
  retries = []

  def fail(self, url, *args, **kwargs):  # every HTTP request TFDS makes
    retries.append(downloader.MAX_RETRIES)
    raise failure

  monkeypatch.setattr(requests.Session, "get", fail)
  with pytest.raises(data.DataError, match=HOW_TO_PROCEED) as e:
    data.get_datasets(_config(tmp_path), str(tmp_path / "w"))
  assert type(failure).__name__ in str(e.value)
  assert retries and max(retries) <= 2 and downloader.MAX_RETRIES == 10  # bounded, restored


def test_archives_in_the_manual_dir_skip_the_probe(tmp_path, monkeypatch):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "training-parallel-europarl-v7.tgz").write_bytes(b"")
  monkeypatch.setattr(wmt, "probe", lambda *a: pytest.fail("probed with manual archives"))
  seen = {}

  def prepare(self, download_config=None, **kwargs):
    seen["manual_dir"] = download_config.manual_dir
    raise AssertionError("For europarl_v7, you must manually download the following file(s)")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", prepare)
  with pytest.raises(data.DataError, match=HOW_TO_PROCEED.replace(".*manual", str(manual))):
    data.get_datasets(_config(tmp_path, tfds_manual_dir=str(manual)), str(tmp_path / "w"))
  assert str(seen["manual_dir"]) == str(manual)


def test_the_wmt_download_hosts_are_the_builders():
  builder = tfds.builder("wmt14_translate/de-en", data_dir="/nonexistent")
  urls = wmt.download_urls(builder)
  assert any("europarl" in u for u in urls) and all(u.startswith("http") for u in urls)
