"""HTML, subtitles and plain-text files translated by a text translator, as pure functions:
no HTTP library and no model here. `translate` takes a list of plain-text strings and returns
their translations in order (the caller splits sentences and batches); every function here
calls it at most once per document, with all of the document's texts.

HTML (`translate_html`, LibreTranslate's format=html and its .html files): parsed with
BeautifulSoup's html.parser; every text node outside the skipped elements is translated, its
leading and trailing whitespace put back, so tags, attributes and the layout of the source
stay as they are. Following LibreTranslate (translatehtml's NON_TRANSLATEABLE_TAGS), the
contents of address, applet, audio, canvas, code, embed, script, style, time and video are
not translated, nor an element with translate="no", nor (Google's convention) one with class
"notranslate"; as the HTML standard says, translate="yes" (or "") inside such an element
turns translation back on, except inside script and style, which are never text. Comments,
the doctype, CDATA sections, processing instructions and whitespace-only nodes are kept as
they are. Attribute values (alt, title, placeholder, ...) are not translated, as in
LibreTranslate, unless named in `attributes`. In pre and textarea, where line breaks show,
each line is translated by itself. The answer is BeautifulSoup's serialisation of its
parse, so for an identity translation it is the input normalised thus: tag and attribute
names lower case, attribute values in double quotes (single ones when the value holds a
double quote), attributes in source order (a repeated one: its last value), entities decoded
and then only &, <, > and U+00A0 (as &nbsp;) escaped, void elements written <br/> and their
end tags dropped, stray end tags dropped, unclosed elements closed at their parent's end;
whitespace is kept as written except between top-level nodes (outside every element), where
a run of it becomes one newline or one space.

SRT (`translate_srt`): each cue's text lines are joined with spaces, translated as one text
and wrapped at 40 characters (LibreTranslate's width); cue numbers and timing lines are kept
as written. The parser is this module's own, linear in the input's size (the `srt` package's
regular expression takes 40 s on 20,000 spaces, minutes on 2,000 digits).

Plain text (`translate_txt`): each non-blank line is translated by itself, blank lines and
each line's surrounding whitespace kept.

Files (`translate_file`): UTF-8 only (a BOM is allowed, and kept); the extension picks the
format from FORMATS. Every refusal is a ValueError whose message names the problem.
"""

import functools
import io
import re
import textwrap
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

Translate = Callable[[list[str]], list[str]]

# LibreTranslate's NON_TRANSLATEABLE_TAGS (translatehtml): contents left as they are.
SKIPPED_TAGS = frozenset(
  {"address", "applet", "audio", "canvas", "code", "embed", "script", "style", "time", "video"}
)
# Never text, whatever a translate attribute says.
RAW_TAGS = frozenset({"script", "style"})
# Line breaks show: each line is translated by itself.
LINE_TAGS = frozenset({"pre", "textarea"})
NO_TRANSLATE_CLASS = "notranslate"
SRT_WIDTH = 40  # LibreTranslate's textwrap width for a translated cue

BOM = b"\xef\xbb\xbf"
_SRT_TIME = re.compile(r"(\d+):([0-5]\d):([0-5]\d)[,.](\d{3})")
_SRT_NUMBER = re.compile(r"[0-9]+")
_SHOWN = 60  # characters of a bad line quoted in a message


def _split_space(text: str) -> tuple[str, str, str]:
  """(leading whitespace, the rest stripped, trailing whitespace)."""
  core = text.strip()
  if not core:
    return text, "", ""
  lead = text[: len(text) - len(text.lstrip())]
  return lead, core, text[len(lead) + len(core) :]


def _pieces(text: str, by_line: bool, texts: list[str]) -> list[str | int] | None:
  """`text` as kept strings and indices into `texts`, where its stripped parts (each line's,
  with by_line) are appended; None when nothing in it is to be translated."""
  out: list[str | int] = []
  found = False
  for i, part in enumerate(text.split("\n") if by_line else [text]):
    if i:
      out.append("\n")
    lead, core, trail = _split_space(part)
    if core:
      out += [lead, len(texts), trail]
      texts.append(core)
      found = True
    else:
      out.append(part)
  return out if found else None


def _join(pieces: list[str | int], results: list[str]) -> str:
  return "".join(p if isinstance(p, str) else results[p] for p in pieces)


def _translate_all(texts: list[str], translate: Translate) -> list[str]:
  """One call for all of a document's texts (none when it has none), its answer checked."""
  if not texts:
    return []
  results = list(translate(list(texts)))
  if len(results) != len(texts) or not all(isinstance(r, str) for r in results):
    raise RuntimeError(f"translate answered {len(results)} values for {len(texts)} texts")
  return results


def translate_txt(text: str, translate: Translate) -> str:
  """A plain-text file with each non-blank line translated by itself, its surrounding
  whitespace and the blank lines kept (with CRLF line ends, the CR is trailing whitespace)."""
  texts: list[str] = []
  pieces = _pieces(text, True, texts)
  return text if pieces is None else _join(pieces, _translate_all(texts, translate))


# ---------------------------------------------------------------------------------- HTML


class _EveryTag:
  """A set holding every tag name: BeautifulSoup keeps whitespace-only strings as they are
  inside these (by default only in pre and textarea; elsewhere it makes them one newline or
  one space)."""

  def __contains__(self, name: object) -> bool:
    return True


@functools.cache
def _html_tools() -> tuple[Any, dict[str, Any]]:
  """(the formatter, the parser's options) of translate_html."""
  from bs4.dammit import EntitySubstitution
  from bs4.element import Doctype, NavigableString
  from bs4.formatter import HTMLFormatter

  class SourceOrder(HTMLFormatter):
    """bs4's "minimal" escaping, U+00A0 written &nbsp;, attributes in source order (bs4
    sorts them by default)."""

    def attributes(self, tag: Any) -> list[tuple[str, Any]]:
      return list(tag.attrs.items())

  class SourceDoctype(Doctype):
    """No newline added after the doctype (bs4 writes one)."""

    SUFFIX = ">"

  class Text(NavigableString):
    """A text node written as its translation once it has one: the tree is not changed
    (bs4's replace_with looks the node up among its siblings, quadratic in a long list)."""

    translated: str | None = None

    def output_ready(self, formatter: Any = "minimal") -> str:
      if self.translated is None:
        return super().output_ready(formatter)
      return self.PREFIX + self.format_string(self.translated, formatter) + self.SUFFIX

  formatter = SourceOrder(
    entity_substitution=lambda s: EntitySubstitution.substitute_xml(s).replace("\xa0", "&nbsp;")
  )
  options = dict(
    preserve_whitespace_tags=_EveryTag(),
    multi_valued_attributes=None,  # class="a  b" kept as written, not as a list
    element_classes={Doctype: SourceDoctype, NavigableString: Text},
  )
  return formatter, options


def _mode(tag: Any, inherited: bool) -> bool:
  """Whether an element's text is translated: translate="no" or class notranslate says no,
  translate="yes" or "" says yes, a skipped element no, otherwise as its parent."""
  value = tag.get("translate")
  value = value.strip().lower() if isinstance(value, str) else None
  classes = tag.get("class")
  if value == "no" or (isinstance(classes, str) and NO_TRANSLATE_CLASS in classes.split()):
    return False
  if value in ("yes", ""):
    return True
  if tag.name in SKIPPED_TAGS:
    return False
  return inherited


def translate_html(html: str, translate: Translate, attributes: Collection[str] = ()) -> str:
  """`html` with its visible text translated in one call to `translate` (module docstring).
  attributes: names of attributes whose values are translated too (in translated elements
  only; none by default, as LibreTranslate)."""
  import bs4

  formatter, options = _html_tools()
  # Given as a file, the text skips bs4's checks for a file name or URL given by mistake:
  # their warnings, and their UTF-8 encoding, which a lone surrogate (JSON can carry one)
  # would stop.
  soup = bs4.BeautifulSoup(io.StringIO(html), "html.parser", **options)
  texts: list[str] = []
  nodes: list[tuple[Any, list[str | int]]] = []
  values: list[tuple[Any, str, list[str | int]]] = []
  # Document order without recursion (a deeply nested document must not overflow the stack).
  stack: list[tuple[Any, bool, bool]] = [(soup, True, False)]
  while stack:
    node, on, by_line = stack.pop()
    below = []
    for child in node.contents:
      if isinstance(child, bs4.Tag):
        if child.name in RAW_TAGS:
          continue
        child_on = _mode(child, on)
        if child_on:
          for name in attributes:
            value = child.attrs.get(name)
            if isinstance(value, str):
              pieces = _pieces(value, False, texts)
              if pieces is not None:
                values.append((child, name, pieces))
        below.append((child, child_on, by_line or child.name in LINE_TAGS))
      elif on and not isinstance(child, bs4.element.PreformattedString):
        # Text; comments, the doctype, CDATA and processing instructions are
        # PreformattedStrings, kept as they are.
        pieces = _pieces(str(child), by_line, texts)
        if pieces is not None:
          nodes.append((child, pieces))
    stack += reversed(below)
  results = _translate_all(texts, translate)
  for node, pieces in nodes:
    node.translated = _join(pieces, results)
  for tag, name, pieces in values:
    tag[name] = _join(pieces, results)
  return soup.decode(formatter=formatter)


# ----------------------------------------------------------------------------------- SRT


class Cue(NamedTuple):
  number: str  # as written
  timing: str  # the timing line as written, stripped
  lines: tuple[str, ...]  # the text lines as written (CR removed)
  line: int  # where the cue's number is, counting from 1


def _shown(text: str) -> str:
  return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _check_timing(timing: str, line: int) -> None:
  start, arrow, rest = timing.partition("-->")
  parts = rest.split(None, 1)
  end = parts[0] if parts else ""
  if not arrow or not _SRT_TIME.fullmatch(start.strip()) or not _SRT_TIME.fullmatch(end):
    raise ValueError(
      f"invalid SRT: line {line}: expected a timing line 'HH:MM:SS,mmm --> HH:MM:SS,mmm', "
      f"found {_shown(timing)}"
    )


def parse_srt(text: str) -> list[Cue]:
  """The cues of an SRT file: blocks of non-blank lines, each a cue number, a timing line
  (a ',' or '.' before the milliseconds, anything after the end time kept) and text lines.
  A block that does not start with a number continues the cue before it (a blank line inside
  a cue, as the `srt` package allows). Time and memory linear in len(text)."""
  lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
  if lines[0].startswith("\ufeff"):
    lines[0] = lines[0][1:]
  found: list[tuple[str, str, list[str], int]] = []
  i = 0
  while i < len(lines):
    if not lines[i].strip():
      i += 1
      continue
    start = i
    while i < len(lines) and lines[i].strip():
      i += 1
    block = lines[start:i]
    first = block[0].strip()
    if _SRT_NUMBER.fullmatch(first):
      if len(block) < 2:
        raise ValueError(f"invalid SRT: line {start + 1}: cue {first} has no timing line")
      timing = block[1].strip()
      _check_timing(timing, start + 2)
      found.append((first, timing, block[2:], start + 1))
    elif "-->" in first:
      raise ValueError(f"invalid SRT: line {start + 1}: a timing line without a cue number")
    elif found:
      found[-1][2].extend(block)
    else:
      raise ValueError(
        f"invalid SRT: line {start + 1}: expected a cue number, found {_shown(first)}"
      )
  if not found:
    raise ValueError("invalid SRT: no subtitle cues found")
  return [Cue(number, timing, tuple(text), line) for number, timing, text, line in found]


def translate_srt(text: str, translate: Translate) -> str:
  """An SRT file with each cue's text translated (its lines joined with spaces, the
  translation wrapped at SRT_WIDTH), numbers and timing lines as written, one blank line
  after each cue, the file's line ends (CRLF or LF). ValueError when it is not SRT."""
  cues = parse_srt(text)
  texts = [" ".join(line.strip() for line in cue.lines if line.strip()) for cue in cues]
  wanted = [t for t in texts if t]
  results = iter(_translate_all(wanted, translate))
  eol = "\r\n" if "\r\n" in text else "\n"
  out = []
  for cue, source in zip(cues, texts):
    shown = []
    if source:
      shown = textwrap.wrap(
        next(results), width=SRT_WIDTH, break_long_words=False, break_on_hyphens=False
      )
    out.append(eol.join([cue.number, cue.timing, *shown]) + eol + eol)
  return "".join(out)


# --------------------------------------------------------------------------------- files


class Format(NamedTuple):
  translate: Callable[[str, Translate], str]
  media_type: str  # of the translated file
  kind: str  # as messages name it


HTML = Format(translate_html, "text/html; charset=utf-8", "HTML file")
FORMATS = {
  ".htm": HTML,
  ".html": HTML,
  ".srt": Format(translate_srt, "application/x-subrip; charset=utf-8", "SRT file"),
  ".txt": Format(translate_txt, "text/plain; charset=utf-8", "text file"),
}


def extension_of(filename: str) -> str:
  """The lower-case extension of an uploaded file's name, one of FORMATS' (ValueError naming
  them otherwise). LibreTranslate's message starts the same: 'file format not supported'."""
  base = re.split(r"[/\\]", filename)[-1]
  dot = base.rfind(".")
  extension = base[dot:].lower() if dot > 0 else ""
  if extension not in FORMATS:
    shown = _shown(extension) if extension else "a name without an extension"
    raise ValueError(
      f"file format not supported: {shown} (supported: {', '.join(sorted(FORMATS))})"
    )
  return extension


def decode_upload(data: bytes, extension: str) -> tuple[str, bool]:
  """(text, whether it started with a UTF-8 BOM) of an uploaded file: UTF-8 required, and no
  NUL (a UTF-16 or binary file decodes as UTF-8 with NULs); ValueError naming the file kind."""
  kind = FORMATS[extension].kind
  bom = data.startswith(BOM)
  try:
    text = data[len(BOM) :].decode("utf-8") if bom else data.decode("utf-8")
  except UnicodeDecodeError as e:
    at = e.start + (len(BOM) if bom else 0)
    raise ValueError(
      f"the {kind} is not UTF-8 text ({e.reason} at byte {at}): save it as UTF-8"
    ) from None
  nul = text.find("\0")
  if nul != -1:
    raise ValueError(
      f"the {kind} holds a NUL character (at character {nul}): is it UTF-16 or binary? "
      "It must be UTF-8 text"
    )
  return text, bom


def translate_file(data: bytes, filename: str, translate: Translate) -> tuple[bytes, str]:
  """(translated bytes, their media type) of an uploaded file, by its name's extension; the
  answer is UTF-8, with a BOM when the upload had one. ValueError for a refused file."""
  extension = extension_of(filename)
  text, bom = decode_upload(data, extension)
  found = FORMATS[extension]
  out = found.translate(text, translate).encode("utf-8", errors="replace")
  return (BOM + out if bom else out), found.media_type
