"""Strict reading of aligned plain-text corpora: bad input fails loudly, naming file and line.

Line i of the source file is the translation of line i of the target file, so anything that
could shift one side against the other (lone CRs read as newlines, a missing line, undecodable
bytes silently replaced) is either handled exactly or reported.
"""

from etils import epath

from t2t_jax.data.errors import DataError


def read_lines(path: str, flag: str = "") -> list[str]:
  """Returns the lines of a UTF-8 file without terminators (LF or CRLF; BOM dropped).

  Only '\\n' ends a line: a stray '\\r' or U+2028 inside a sentence must not split it.
  Raises DataError naming the file (and `config.data.<flag>`), and the line for bad UTF-8.
  """
  where = f" (config.data.{flag})" if flag else ""
  try:
    data = epath.Path(path).read_bytes()
  except FileNotFoundError:
    raise DataError(f"{path}: no such file{where}") from None
  except OSError as e:  # a directory, no permission, I/O error
    raise DataError(f"{path}: cannot read: {e.strerror or e}{where}") from None
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    raise DataError(
      f"{path}:{line}: bytes that are not UTF-8 at byte {column} of the line "
      f"({data[e.start : e.end]!r}: {e.reason}){where}"
    ) from None
  lines = text.removeprefix("\ufeff").split("\n")
  if lines[-1] == "":  # the final newline ends the last line, it does not start a new one
    lines.pop()
  return [line.removesuffix("\r") for line in lines]


def read_parallel(source_path: str, target_path: str, split: str = "") -> list[tuple[str, str]]:
  """Returns the aligned (source, target) lines of two files, empty lines included.

  Empty lines are kept here, as pairs, so that skipping them later is counted and can never
  shift alignment. Raises DataError naming both files and both counts if the counts differ.
  """
  src_flag, tgt_flag = (f"{split}_source", f"{split}_target") if split else ("", "")
  sources = read_lines(source_path, src_flag)
  targets = read_lines(target_path, tgt_flag)
  if len(sources) != len(targets):
    raise DataError(
      f"{split or 'parallel'} files are not aligned: {source_path} has {len(sources)} lines "
      f"but {target_path} has {len(targets)} lines"
    )
  return list(zip(sources, targets))


def is_empty(text: str) -> bool:
  """A line with nothing but whitespace carries no sentence."""
  return not text.strip()
