"""Lines of text to decode, read from a file, stdin or a stream: UTF-8 without line ends; a
line that is not UTF-8 stops with a `TranslateError` naming the file and line."""

import sys
from collections.abc import Iterator
from typing import BinaryIO

from t2t_jax.decoding.workdirs import TranslateError


def read_lines(path: str | None) -> list[str]:
  """Lines of a UTF-8 file (or stdin), without line ends; bad bytes name the line."""
  try:
    if path in (None, "", "-"):
      raw = sys.stdin.buffer.read()
    else:
      with open(path, "rb") as f:
        raw = f.read()
  except OSError as e:
    raise TranslateError(f"{path}: cannot read ({e.strerror})") from e
  name = path or "<stdin>"
  lines = raw.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  out = []
  for number, line in enumerate(lines, start=1):
    try:
      out.append(line.rstrip(b"\r").decode("utf-8"))
    except UnicodeDecodeError as e:
      raise TranslateError(f"{name}:{number}: not UTF-8 ({e.reason} at byte {e.start})") from e
  return out


def stream_lines(
  stream: BinaryIO, name: str = "<stdin>", prompt: str | None = None
) -> Iterator[str]:
  """Lines of a binary stream as they arrive (one readline each, nothing read ahead).

  A line that is not UTF-8 stops with an error naming it, as read_lines does. `prompt` is
  written to stderr before each read (interactive use at a terminal).
  """
  number = 0
  while True:
    if prompt:
      sys.stderr.write(prompt)
      sys.stderr.flush()
    raw = stream.readline()
    if not raw:
      return
    number += 1
    try:
      yield raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError as e:
      raise TranslateError(f"{name}:{number}: not UTF-8 ({e.reason} at byte {e.start})") from e
