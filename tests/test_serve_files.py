"""t2t-serve's store of translated files (t2t_jax/serve/files.py): ids it makes and checks,
a private directory, expiry on an injected clock, the upload limit's message, download
names safe for a header, and puts from many threads."""

import os
import stat
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from t2t_jax.serve import files


class Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


@pytest.fixture
def clock():
  return Clock()


@pytest.fixture
def store(tmp_path, clock):
  with files.FileStore(str(tmp_path / "root"), expiry_s=60, max_bytes=10, clock=clock) as s:
    yield s


def test_put_get_round_trip_and_media_types(store):
  html = store.put(b"<p>x</p>", ".HTML", "page_de.html")
  other = store.put(b"\x00\x01", ".exe", "tool_de.exe")
  assert store.get(html) == (b"<p>x</p>", "page_de.html", "text/html; charset=utf-8")
  assert store.get(other) == (b"\x00\x01", "tool_de.exe", "application/octet-stream")
  assert html.endswith(".html") and "." not in other
  assert files.ID_PATTERN.fullmatch(html) and files.ID_PATTERN.fullmatch(other)
  assert len(store) == 2


def test_names_on_disk_are_the_stores_never_the_clients(store):
  client = "../SECRETNAME/..\\x/SECRETNAME.srt"
  file_id = store.put(b"1", ".srt", client)
  assert os.listdir(store.directory) == [file_id]
  assert "SECRETNAME" not in file_id and ".." not in file_id
  assert store.get(file_id)[1] == "SECRETNAME.srt"


def test_private_directory_inside_root_and_removed_on_close(tmp_path, clock):
  root = tmp_path / "root"
  root.mkdir()
  (root / "other").write_text("not the store's")
  s = files.FileStore(str(root), expiry_s=1, max_bytes=-1, clock=clock)
  file_id = s.put(b"x", ".txt", "a.txt")
  assert os.path.dirname(s.directory) == str(root)
  assert stat.S_IMODE(os.stat(s.directory).st_mode) == 0o700
  assert stat.S_IMODE(os.stat(os.path.join(s.directory, file_id)).st_mode) == 0o600
  clock.now += 10
  assert s.sweep() == 1
  s.close()
  assert not os.path.exists(s.directory)
  assert sorted(os.listdir(root)) == ["other"]
  with pytest.raises(RuntimeError, match="closed"):
    s.put(b"x", ".txt", "a.txt")


def test_no_root_is_a_private_temporary_directory(clock):
  with files.FileStore(None, expiry_s=1, max_bytes=-1, clock=clock) as s:
    assert stat.S_IMODE(os.stat(s.directory).st_mode) == 0o700
    assert os.path.basename(s.directory).startswith("t2t-files-")


def test_expiry_on_get_put_and_sweep(store, clock):
  first = store.put(b"a", ".txt", "a.txt")
  path = os.path.join(store.directory, first)
  clock.now += 60  # exactly expiry_s old: still there
  assert store.get(first)[0] == b"a"
  clock.now += 0.001
  with pytest.raises(KeyError):
    store.get(first)
  assert not os.path.exists(path)
  # A put deletes what has expired, and sweep() too.
  second = store.put(b"b", ".txt", "b.txt")
  clock.now += 30
  third = store.put(b"c", ".txt", "c.txt")
  clock.now += 31
  fourth = store.put(b"d", ".txt", "d.txt")
  assert sorted(os.listdir(store.directory)) == sorted([third, fourth])
  clock.now += 31
  assert store.sweep() == 1
  assert os.listdir(store.directory) == [fourth]
  assert store.get(fourth)[0] == b"d"
  for gone in (second, third):
    with pytest.raises(KeyError):
      store.get(gone)


BAD_IDS = [
  "../x",
  "..",
  "/etc/passwd",
  "../" + "a" * 22,
  "a" * 22 + "/",
  "a" * 22 + "/../x",
  "a" * 22 + ".exe",
  "a" * 22 + ".html.html",
  "a" * 21,
  "a" * 23,
  "a" * 21 + ".",
  "a" * 20 + "%2e%2e",
  "a" * 22 + "\x00",
  "a" * 22 + "\n",
  "",
  None,
  22,
  b"a" * 22,
]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_malformed_ids_are_refused_before_any_lookup(store, bad):
  assert not (isinstance(bad, str) and files.ID_PATTERN.fullmatch(bad))
  with pytest.raises(KeyError):
    store.get(bad)


def test_only_files_the_store_wrote_are_read(store):
  planted = "A" * 22 + ".txt"
  with open(os.path.join(store.directory, planted), "wb") as f:
    f.write(b"planted")
  assert files.ID_PATTERN.fullmatch(planted)
  with pytest.raises(KeyError):
    store.get(planted)


def test_check_size_message(store):
  store.check_size(10)
  with pytest.raises(files.FileTooLargeError) as e:
    store.check_size(11)
  assert str(e.value) == "file too large: 11 bytes, the limit is 10"
  assert (e.value.size, e.value.limit) == (11, 10)
  unlimited = files.FileStore(None, expiry_s=1, max_bytes=-1)
  unlimited.check_size(10**12)
  unlimited.close()


@pytest.mark.parametrize("expiry_s, max_bytes", [(0, 1), (-1, 1), (float("nan"), 1), (1, -2)])
def test_bad_settings(expiry_s, max_bytes):
  with pytest.raises(ValueError):
    files.FileStore(None, expiry_s=expiry_s, max_bytes=max_bytes)


@pytest.mark.parametrize(
  "name, safe",
  [
    ("report_de.txt", "report_de.txt"),
    ("../../etc/passwd", "passwd"),
    ("C:\\Users\\me\\notes.txt", "notes.txt"),
    ('a"b\r\nc;d.txt', "a_b_c_d.txt"),
    ("\u202egnp.exe", "gnp.exe"),  # a right-to-left override
    ("Отчёт 2024.srt", "Отчёт_2024.srt"),
    ("a\ud800b.txt", "a_b.txt"),
    ("..hidden..txt", "hidden.txt"),
    ("", "translated"),
    ("...", "translated"),
    ("x" * 300 + ".html", "x" * (files.MAX_NAME - 5) + ".html"),
  ],
)
def test_safe_download_name(name, safe):
  assert files.safe_download_name(name) == safe


@given(st.text(st.characters(exclude_categories=()), max_size=200))
def test_safe_download_name_any_input(name):
  safe = files.safe_download_name(name)
  assert 0 < len(safe) <= files.MAX_NAME
  assert all(c.isalnum() or c in "-_." for c in safe)
  assert not safe.startswith(".") and ".." not in safe
  header = files.content_disposition(name)
  header.encode("ascii")  # a header value, whatever the name
  assert header.count('"') == 2


def test_translated_name_and_content_disposition():
  assert files.translated_name("report.txt", "de") == "report_de.txt"
  assert files.translated_name("../my notes.v2.srt", "fr") == "my_notes.v2_fr.srt"
  assert files.translated_name("README", "es") == "README_es"
  assert files.content_disposition("report_de.txt") == 'attachment; filename="report_de.txt"'
  assert files.content_disposition("Отчёт.txt") == (
    "attachment; filename=\"_____.txt\"; filename*=UTF-8''%D0%9E%D1%82%D1%87%D1%91%D1%82.txt"
  )


def test_concurrent_puts_from_threads(tmp_path, clock):
  store = files.FileStore(str(tmp_path), expiry_s=60, max_bytes=-1, clock=clock)
  found = {}
  lock = threading.Lock()
  start = threading.Barrier(8)

  def work(n):
    start.wait()
    for k in range(25):
      data = f"{n}-{k}".encode()
      file_id = store.put(data, ".txt", f"{n}-{k}.txt")
      with lock:
        found[file_id] = data

  threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(found) == 200 == len(store) == len(os.listdir(store.directory))
  for file_id, data in found.items():
    assert store.get(file_id)[:2] == (data, data.decode() + ".txt")
  store.close()
