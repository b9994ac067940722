"""Translated files kept for download (LibreTranslate's /translate_file and /download_file),
with no HTTP library here.

A FileStore writes each file into a private directory of its own (tempfile.mkdtemp, mode
0o700, under `root` or the system's temporary directory; it deletes nothing it did not
write), under a name it makes: 22 random URL-safe characters (secrets.token_urlsafe(16)),
then the extension when it is one of formats.FORMATS'. Nothing of the client's file name
reaches the path; the name offered for the download is kept beside it, cleaned of all but
letters, digits, '-', '_' and '.'. An id given back is checked against ID_PATTERN before it
is looked up, and only files the store wrote are ever read. A file older than expiry_s
seconds is deleted (at each put and get, and by sweep()), as LibreTranslate deletes its
after 30 minutes. The index is in memory: one process, and a restart forgets every file
(its directory is removed by close()). All methods may be called from any thread.
"""

import contextlib
import dataclasses
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
import unicodedata
import urllib.parse
from collections.abc import Callable
from typing import Any

from t2t_jax.serve.formats import FORMATS

TOKEN_BYTES = 16  # secrets.token_urlsafe(16): 22 characters, 128 random bits
ID_PATTERN = re.compile(
  r"[A-Za-z0-9_-]{22}(?:\.(?:" + "|".join(re.escape(e[1:]) for e in sorted(FORMATS)) + r"))?"
)
MAX_NAME = 120  # characters of a download name
DEFAULT_NAME = "translated"
OTHER_MEDIA_TYPE = "application/octet-stream"


class FileTooLargeError(Exception):
  """An upload over the store's limit (HTTP 413)."""

  def __init__(self, size: int, limit: int) -> None:
    super().__init__(f"file too large: {size} bytes, the limit is {limit}")
    self.size = size
    self.limit = limit


def safe_download_name(name: str) -> str:
  """`name` as a download may be called: its last path part, NFC, every character but
  letters, digits, '-', '_' and '.' replaced by '_' (controls, quotes, bidi marks, lone
  surrogates), runs of '_' and of '.' made one, no '.' or '_' at either end, at most
  MAX_NAME characters (the extension kept when short); DEFAULT_NAME when nothing is left."""
  base = re.split(r"[/\\]", unicodedata.normalize("NFC", name))[-1]
  kept = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)
  kept = re.sub(r"\.\.+", ".", re.sub(r"__+", "_", kept)).strip("._")
  if len(kept) > MAX_NAME:
    stem, dot, extension = kept.rpartition(".")
    if dot and len(extension) <= 16:
      kept = stem[: MAX_NAME - len(extension) - 1].rstrip("._") + "." + extension
    else:
      kept = kept[:MAX_NAME].rstrip("._")
  return kept or DEFAULT_NAME


def translated_name(filename: str, target: str) -> str:
  """LibreTranslate's name for a translated file: the upload's stem, '_', the target
  language, its extension (report.txt -> report_de.txt), made safe."""
  base = re.split(r"[/\\]", filename)[-1]
  stem, dot, extension = base.rpartition(".")
  if not dot or not stem:
    stem, extension = base, ""
  return safe_download_name(f"{stem}_{target}" + (f".{extension}" if extension else ""))


def content_disposition(name: str) -> str:
  """A Content-Disposition header offering `name` (safe_download_name's, so no quote or
  backslash): an ASCII filename, and RFC 6266's filename* when the name is not ASCII."""
  name = safe_download_name(name)
  ascii_name = "".join(c if c.isascii() else "_" for c in name)
  header = f'attachment; filename="{ascii_name}"'
  if ascii_name != name:
    header += "; filename*=UTF-8''" + urllib.parse.quote(name, safe="")
  return header


@dataclasses.dataclass(frozen=True)
class _Entry:
  path: str
  download_name: str
  media_type: str
  created: float


class FileStore:
  """Translated files by id, deleted expiry_s seconds after they were put (module
  docstring). max_bytes: the largest upload check_size allows (-1: no limit). clock: seconds,
  time.monotonic by default (tests pass their own)."""

  def __init__(
    self,
    root: str | None,
    expiry_s: float,
    max_bytes: int,
    clock: Callable[[], float] = time.monotonic,
  ) -> None:
    if not expiry_s > 0:
      raise ValueError(f"expiry_s must be positive, not {expiry_s}")
    if max_bytes < -1:
      raise ValueError(f"max_bytes must be -1 (no limit) or at least 0, not {max_bytes}")
    if root is not None:
      os.makedirs(root, mode=0o700, exist_ok=True)
    self.directory = tempfile.mkdtemp(prefix="t2t-files-", dir=root)
    self.expiry_s = expiry_s
    self.max_bytes = max_bytes
    self._clock = clock
    self._entries: dict[str, _Entry] = {}
    self._lock = threading.Lock()
    self._closed = False

  def check_size(self, n_bytes: int) -> None:
    """FileTooLargeError when an upload of n_bytes is over the limit."""
    if self.max_bytes != -1 and n_bytes > self.max_bytes:
      raise FileTooLargeError(n_bytes, self.max_bytes)

  def put(self, data: bytes, extension: str, download_name: str) -> str:
    """Keep `data`, to be downloaded as `download_name` (made safe); returns its id. The
    extension (one of FORMATS', else none) ends the id and gives the media type."""
    extension = extension.lower()
    known = FORMATS.get(extension)
    suffix = extension if known else ""
    media_type = known.media_type if known else OTHER_MEDIA_TYPE
    name = safe_download_name(download_name)
    with self._lock:
      self._check_open()
      now = self._clock()
      self._sweep(now)
      file_id = secrets.token_urlsafe(TOKEN_BYTES) + suffix
      while file_id in self._entries:
        file_id = secrets.token_urlsafe(TOKEN_BYTES) + suffix
      path = os.path.join(self.directory, file_id)
      # O_EXCL: never through a link or over a file already there.
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
      with os.fdopen(fd, "wb") as f:
        f.write(data)
      self._entries[file_id] = _Entry(path, name, media_type, now)
    return file_id

  def get(self, file_id: Any) -> tuple[bytes, str, str]:
    """(data, download name, media type) of a file; KeyError when the id is malformed,
    unknown or expired."""
    if not isinstance(file_id, str) or not ID_PATTERN.fullmatch(file_id):
      raise KeyError(file_id)
    with self._lock:
      self._check_open()
      self._sweep(self._clock())
      entry = self._entries.get(file_id)
      if entry is None:
        raise KeyError(file_id)
      try:
        with open(entry.path, "rb") as f:
          data = f.read()
      except FileNotFoundError:
        del self._entries[file_id]
        raise KeyError(file_id) from None
    return data, entry.download_name, entry.media_type

  def sweep(self) -> int:
    """Delete the expired files now; how many."""
    with self._lock:
      return self._sweep(self._clock())

  def __len__(self) -> int:
    with self._lock:
      return len(self._entries)

  def close(self) -> None:
    """Delete every file and the directory."""
    with self._lock:
      self._closed = True
      self._entries.clear()
      shutil.rmtree(self.directory, ignore_errors=True)

  def __enter__(self) -> "FileStore":
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()

  def _check_open(self) -> None:
    if self._closed:
      raise RuntimeError("the file store is closed")

  def _sweep(self, now: float) -> int:
    old = [i for i, e in self._entries.items() if now - e.created > self.expiry_s]
    for file_id in old:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(self._entries.pop(file_id).path)
    return len(old)
