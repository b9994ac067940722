"""t2t-serve's file formats as pure functions (t2t_jax/serve/formats.py), with stand-in
translators: HTML keeps every tag, attribute and the whitespace around each text and
translates only the visible text, in one call per document; SRT keeps cue numbers and timing
lines as written; plain text keeps its blank lines; uploads must be UTF-8.

Each rule is checked against an expectation built independently: documents written by hand,
documents rendered from a small grammar twice (as the source, and with the text a marking
translator would give), BeautifulSoup's own serialisation, and the `srt` package's parser.
"""

import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t2t_jax.serve import formats

bs4 = pytest.importorskip("bs4")


def mark(texts):
  """A translator whose answer shows exactly which text it was given."""
  return [f"[{t.upper()}]" for t in texts]


def identity(texts):
  return list(texts)


class Counting:
  def __init__(self, f=mark):
    self.f = f
    self.calls = []

  def __call__(self, texts):
    self.calls.append(list(texts))
    return self.f(texts)


# ---------------------------------------------------------------------------------- HTML

HAND = [
  # Nested inline tags: each text node by itself, the spaces around it kept.
  (
    "<p>Hello <b>bold <i>it</i></b> end.</p>",
    "<p>[HELLO] <b>[BOLD] <i>[IT]</i></b> [END.]</p>",
  ),
  # Entities are decoded for the translator and escaped again (&nbsp; as &nbsp;).
  (
    "<p>Fish &amp; chips&nbsp;&lt;3</p><p>&nbsp;x&nbsp;</p>",
    "<p>[FISH &amp; CHIPS&nbsp;&lt;3]</p><p>&nbsp;[X]&nbsp;</p>",
  ),
  # Attributes with quotes, ampersands and in their source order; values not translated.
  (
    '<a href="/x?a=1&amp;b=2" title=\'say "hi"\' data-x="it\'s" alt="A cat">link</a>',
    '<a href="/x?a=1&amp;b=2" title=\'say "hi"\' data-x="it\'s" alt="A cat">[LINK]</a>',
  ),
  # Script and style untouched, even their markup-like text.
  (
    '<script>var s = "<b>x</b>" && 1 < 2;</script><style>p > a { color: red }</style><p>x</p>',
    '<script>var s = "<b>x</b>" && 1 < 2;</script><style>p > a { color: red }</style><p>[X]</p>',
  ),
  # translate="no" (any case), class notranslate, translate="yes" inside them.
  (
    '<div translate="no">Brand <span translate="yes">tag line</span></div>'
    '<p class="x notranslate">keep</p><p translate=" NO ">k2</p><p translate="">t</p>',
    '<div translate="no">Brand <span translate="yes">[TAG LINE]</span></div>'
    '<p class="x notranslate">keep</p><p translate=" NO ">k2</p><p translate="">[T]</p>',
  ),
  # The doctype, comments and the indentation between tags stay as they are.
  (
    "<!DOCTYPE html>\n<html>\n  <body>\n    <!-- a note -->\n    <p>\n      Some text\n"
    "    </p>\n  </body>\n</html>\n",
    "<!DOCTYPE html>\n<html>\n  <body>\n    <!-- a note -->\n    <p>\n      [SOME TEXT]\n"
    "    </p>\n  </body>\n</html>\n",
  ),
  # pre: line by line; code (LibreTranslate's skipped tags) kept, also inside a sentence.
  (
    "<pre>  one\n\n two  </pre><p>use <code>ls -l</code> now</p>",
    "<pre>  [ONE]\n\n [TWO]  </pre><p>[USE] <code>ls -l</code> [NOW]</p>",
  ),
  # LibreTranslate's other skipped tags; a void element; an empty attribute.
  (
    "<time>May 5</time><address>1 Main St</address><video>v</video><p>a<br>b"
    '<input disabled value="v"></p>',
    "<time>May 5</time><address>1 Main St</address><video>v</video><p>[A]<br/>[B]"
    '<input disabled="" value="v"/></p>',
  ),
  # textarea: line by line too.
  ("<textarea> a \n\nb</textarea>", "<textarea> [A] \n\n[B]</textarea>"),
  # Nothing to translate: no call at all.
  ("<p> \n </p><!-- only a comment -->", "<p> \n </p><!-- only a comment -->"),
]


@pytest.mark.parametrize("source, expected", HAND)
def test_html_by_hand(source, expected):
  translate = Counting()
  assert formats.translate_html(source, translate) == expected
  assert len(translate.calls) == (1 if "[" in expected else 0)


def test_html_attributes_named_are_translated_where_the_element_is():
  source = '<img alt=" A cat " title="t" src="c.png"><p translate="no"><img alt="x"></p>'
  expected = '<img alt=" [A CAT] " title="[T]" src="c.png"/><p translate="no"><img alt="x"/></p>'
  translate = Counting()
  assert formats.translate_html(source, translate, attributes=("alt", "title")) == expected
  assert translate.calls == [["A cat", "t"]]


def test_html_translator_answering_the_wrong_count_is_an_error_not_a_shift():
  with pytest.raises(RuntimeError, match="1 values for 2 texts"):
    formats.translate_html("<p>a</p><p>b</p>", lambda texts: ["x"])


def test_html_deep_nesting_does_not_overflow_the_stack():
  depth = 3000
  source = "<b>" * depth + "x" + "</b>" * depth
  assert formats.translate_html(source, mark) == "<b>" * depth + "[X]" + "</b>" * depth


def test_html_many_siblings_in_linear_time():
  """Replacing each text node in the tree (bs4's replace_with) took 17 s here."""
  started = time.perf_counter()
  out = formats.translate_html("<div>" + "a<br>" * 20_000 + "</div>", mark)
  assert out == "<div>" + "[A]<br/>" * 20_000 + "</div>"
  assert time.perf_counter() - started < 8


# A small grammar of documents written in BeautifulSoup's own output form, so that parsing
# and writing one back gives it unchanged; rendered a second time with the text a marking
# translator gives where the rules say text is translated.
# No textarea or title: newer html.parsers read their contents as text, not markup.
CONTAINERS = ("p", "b", "i", "span", "div", "a", "pre", "code", "time")
VOID = ("br", "img")
TEXT = st.text(alphabet="ab &<>\"'\n\xa0é", min_size=1, max_size=8)
RAW = st.text(alphabet="ab ;=\n", max_size=8)
ATTRIBUTES = st.lists(
  st.tuples(
    st.sampled_from(("class", "title", "translate", "href")),
    st.sampled_from(("x", "notranslate", "a notranslate", "no", "yes", "", "NO", 'a"b', "it's")),
  ),
  max_size=3,
  unique_by=lambda kv: kv[0],
)


def _children(children):
  """Adjacent texts as one (the parser gives one node)."""
  out = []
  for child in children:
    if child[0] == "text" and out and out[-1][0] == "text":
      out[-1] = ("text", out[-1][1] + child[1])
    else:
      out.append(child)
  return out


def _extend(inner):
  return st.one_of(
    st.tuples(st.sampled_from(CONTAINERS), ATTRIBUTES, st.lists(inner, max_size=4)).map(
      lambda t: ("element", t[0], t[1], _children(t[2]))
    ),
    st.tuples(st.sampled_from(VOID), ATTRIBUTES).map(lambda t: ("element", t[0], t[1], [])),
    st.tuples(st.sampled_from(("script", "style")), RAW).map(lambda t: ("raw", t[0], t[1])),
  )


NODES = st.recursive(
  st.one_of(
    TEXT.map(lambda s: ("text", s)),
    st.text(alphabet="ab ", max_size=5).map(lambda s: ("comment", s)),
  ),
  _extend,
  max_leaves=12,
)
DOCUMENTS = st.lists(NODES, max_size=4).map(_children)


def _escape(text):
  return (
    text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\xa0", "&nbsp;")
  )


def _attribute(name, value):
  value = _escape(value)
  if '"' in value:
    return f'{name}="{value.replace(chr(34), "&quot;")}"' if "'" in value else f"{name}='{value}'"
  return f'{name}="{value}"'


def _wrap(text):
  core = text.strip()
  if not core:
    return text
  lead = text[: len(text) - len(text.lstrip())]
  return lead + f"[{core.upper()}]" + text[len(lead) + len(core) :]


def _mode(name, attributes, inherited):
  """The rules as the module docstring states them."""
  found = dict(attributes)
  value = found.get("translate")
  value = None if value is None else value.strip().lower()
  if value == "no" or "notranslate" in found.get("class", "").split():
    return False
  if value in ("yes", ""):
    return True
  return False if name in formats.SKIPPED_TAGS else inherited


def render(nodes, marked, on=True, by_line=False):
  out = []
  for node in nodes:
    if node[0] == "text":
      text = node[1]
      if marked and on:
        text = "\n".join(map(_wrap, text.split("\n"))) if by_line else _wrap(text)
      out.append(_escape(text))
    elif node[0] == "comment":
      out.append(f"<!--{node[1]}-->")
    elif node[0] == "raw":
      out.append(f"<{node[1]}>{node[2]}</{node[1]}>")
    else:
      _, name, attributes, children = node
      opened = "".join(" " + _attribute(k, v) for k, v in attributes)
      if name in VOID:
        out.append(f"<{name}{opened}/>")
      else:
        inner = render(
          children, marked, _mode(name, attributes, on), by_line or name in formats.LINE_TAGS
        )
        out.append(f"<{name}{opened}>{inner}</{name}>")
  return "".join(out)


@settings(max_examples=200, deadline=None)
@given(DOCUMENTS)
def test_html_grammar_documents_keep_everything_but_the_translated_text(nodes):
  source = render(nodes, marked=False)
  expected = render(nodes, marked=True)
  assert formats.translate_html(source, identity) == source
  translate = Counting()
  assert formats.translate_html(source, translate) == expected
  assert len(translate.calls) == (1 if expected != source else 0)


class EveryTag:
  def __contains__(self, name):
    return True


def bs4_serialisation(source):
  """BeautifulSoup's own parse and output of `source`: html.parser keeping whitespace-only
  strings in every element and class as written, the doctype without an added newline;
  "minimal" escaping with U+00A0 as &nbsp;, attributes in source order."""

  class SourceOrder(bs4.formatter.HTMLFormatter):
    def attributes(self, tag):
      return list(tag.attrs.items())

  class Doctype(bs4.element.Doctype):
    SUFFIX = ">"

  soup = bs4.BeautifulSoup(
    source,
    "html.parser",
    preserve_whitespace_tags=EveryTag(),
    multi_valued_attributes=None,
    element_classes={bs4.element.Doctype: Doctype},
  )
  escape = lambda s: bs4.dammit.EntitySubstitution.substitute_xml(s).replace("\xa0", "&nbsp;")
  return soup.decode(formatter=SourceOrder(escape))


PIECES = st.sampled_from(
  (
    "<p>",
    "</p>",
    "<b>",
    "</b>",
    "<br>",
    "<br/>",
    "<img alt='x'>",
    '<a href="?a=1&b=2">',
    "</a>",
    "<!-- c -->",
    "<!DOCTYPE html>",
    "&amp;",
    "&nbsp;",
    "&lt;",
    "&#x41;",
    "&bogus;",
    " ",
    "\n",
    "\t",
    "text",
    "Zoë",
    "<",
    ">",
    "&",
    '"',
    "'",
    "<script>1<2</script>",
    "<style>a{}</style>",
    '<span translate="no">',
    "</span>",
    "<pre>",
    "</pre>",
    "<code>",
    "<![CDATA[x]]>",
    "<?php x ?>",
    "\x00",
    "<P CLASS=A>",
    "<div class='notranslate'>",
  )
)


@settings(max_examples=200, deadline=None)
@given(st.lists(PIECES, max_size=20).map("".join))
def test_html_identity_is_beautifulsoups_own_serialisation(source):
  """What round-trips: for any input, an identity translation gives BeautifulSoup's
  serialisation of its parse (so a document already in that form comes back unchanged),
  and a marking one changes the text only (the same tags and attributes, in order)."""
  assert formats.translate_html(source, identity) == bs4_serialisation(source)
  marked = bs4.BeautifulSoup(formats.translate_html(source, mark), "html.parser")
  original = bs4.BeautifulSoup(source, "html.parser")
  shape = lambda soup: [(t.name, list(t.attrs.items())) for t in soup.find_all(True)]
  assert shape(marked) == shape(original)


ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)  # surrogates too


@settings(max_examples=100, deadline=None)
@given(ANY_TEXT)
def test_html_any_text_never_crashes(source):
  """NULs, lone surrogates, stray brackets: an answer, never an exception (nor a warning
  that it looks like a file name or a URL)."""
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert isinstance(formats.translate_html(source, mark), str)


def test_html_lone_surrogates_and_file_like_text_pass_through():
  assert (
    formats.translate_html("<p t='\ud800'>a\ud800</p>", identity) == '<p t="\ud800">a\ud800</p>'
  )
  assert formats.translate_html("page.html", mark) == "[PAGE.HTML]"


# ----------------------------------------------------------------------------------- SRT

SRT = (
  "1\n00:00:01,000 --> 00:00:02,500\nHello there.\nHow are you?\n\n"
  "2\n00:00:03.250 --> 00:00:04,000 X1:10 X2:20\n- Fine.\n\n"
  "10\n01:02:03,004 --> 01:02:05,000\n\n"
  "11\n01:02:06,000 --> 01:02:07,000\n"
  "A rather long line of subtitle text that goes past forty characters\n"
)


def test_srt_numbers_and_timing_lines_kept_as_written_cue_lines_joined():
  translate = Counting()
  out = formats.translate_srt(SRT, translate)
  assert translate.calls == [
    [
      "Hello there. How are you?",
      "- Fine.",
      "A rather long line of subtitle text that goes past forty characters",
    ]
  ]
  blocks = out.split("\n\n")
  assert blocks[-1] == ""
  assert [b.split("\n")[:2] for b in blocks[:-1]] == [
    ["1", "00:00:01,000 --> 00:00:02,500"],
    ["2", "00:00:03.250 --> 00:00:04,000 X1:10 X2:20"],
    ["10", "01:02:03,004 --> 01:02:05,000"],
    ["11", "01:02:06,000 --> 01:02:07,000"],
  ]
  assert blocks[0].split("\n")[2:] == ["[HELLO THERE. HOW ARE YOU?]"]
  assert blocks[2].split("\n")[2:] == []  # a cue without text stays so, and is not sent
  wrapped = blocks[3].split("\n")[2:]
  assert len(wrapped) > 1 and all(len(line) <= formats.SRT_WIDTH for line in wrapped)
  assert (
    " ".join(wrapped) == "[A RATHER LONG LINE OF SUBTITLE TEXT THAT GOES PAST FORTY CHARACTERS]"
  )


def test_srt_crlf_and_bom_kept_through_translate_file():
  data = formats.BOM + SRT.replace("\n", "\r\n").encode()
  out, media_type = formats.translate_file(data, "film.SRT", identity)
  assert media_type.startswith("application/x-subrip")
  assert out.startswith(formats.BOM + b"1\r\n00:00:01,000 --> 00:00:02,500\r\n")
  assert b"\n" not in out.replace(b"\r\n", b"")


@pytest.mark.parametrize(
  "source, message",
  [
    ("", "no subtitle cues found"),
    (" \n\n", "no subtitle cues found"),
    ("Hello, world\n", "line 1: expected a cue number, found 'Hello, world'"),
    ("1\n", "line 1: cue 1 has no timing line"),
    ("1\n00:00:01 --> 00:00:02\nx\n", "line 2: expected a timing line"),
    ("1\n00:00:01,000 -> 00:00:02,000\nx\n", "line 2: expected a timing line"),
    ("1\n00:00:01,000 --> 00:00:02\nx\n", "line 2: expected a timing line"),
    ("1\n00:00:01,000 -->\nx\n", "line 2: expected a timing line"),
    ("1\n00:00:01,000 --> 00:00:02,000\nx\n\n2\n00:61:00,000 --> 01:00:00,000\n", "line 6"),
    ("00:00:01,000 --> 00:00:02,000\nx\n", "line 1: a timing line without a cue number"),
    ("\n\n3\nnot a timing line " + "x" * 100, "line 4: expected a timing line"),
  ],
)
def test_srt_invalid_is_a_value_error_naming_the_problem(source, message):
  with pytest.raises(ValueError, match="invalid SRT") as e:
    formats.translate_srt(source, mark)
  assert message in str(e.value)
  assert len(str(e.value)) < 200


def test_srt_blank_line_inside_a_cue_continues_it():
  source = (
    "1\n00:00:01,000 --> 00:00:02,000\nHello\n\nworld\n\n2\n00:00:03,000 --> 00:00:04,000\nx\n"
  )
  assert [c.lines for c in formats.parse_srt(source)] == [("Hello", "world"), ("x",)]


def test_srt_parsing_is_linear_where_the_srt_package_is_not():
  """The `srt` package's regular expression takes about 40 s on 20,000 spaces and minutes
  on 2,000 digits; these are 10 to 100 times larger."""
  started = time.perf_counter()
  for bad in (" " * 200_000 + "x", "1" * 200_000 + "x", "\n" * 200_000 + "x", "<" * 200_000):
    with pytest.raises(ValueError):
      formats.parse_srt(bad)
  cue = "1\n00:00:01,000 --> 00:00:02,000\n" + "1" * 200_000 + "\n"
  assert len(formats.parse_srt(cue + ("\nx\n" * 20_000))[0].lines) == 20_001
  assert time.perf_counter() - started < 5


TIMES = st.tuples(
  st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999)
).map(lambda t: f"{t[0]:02d}:{t[1]:02d}:{t[2]:02d},{t[3]:03d}")
CUE_LINES = st.lists(
  st.text(alphabet="ab ,.?-é", min_size=1, max_size=12).filter(lambda s: s.strip()),
  max_size=3,
)
CUES = st.lists(
  st.tuples(st.integers(0, 9999), TIMES, TIMES, st.sampled_from(("", "X1:1 X2:2")), CUE_LINES),
  min_size=1,
  max_size=5,
)


def _srt_file(cues, eol):
  blocks = []
  for number, start, end, extra, lines in cues:
    timing = f"{start} --> {end}" + (f" {extra}" if extra else "")
    blocks.append(eol.join([str(number), timing, *lines]) + eol)
  return eol.join(blocks)


@settings(max_examples=200, deadline=None)
@given(CUES, st.sampled_from(("\n", "\r\n")))
def test_srt_parse_agrees_with_the_srt_package(cues, eol):
  srt = pytest.importorskip("srt")
  source = _srt_file(cues, eol)
  ours = formats.parse_srt(source)
  theirs = list(srt.parse(source))
  assert [int(c.number) for c in ours] == [s.index for s in theirs]
  timings = [c.timing.split(None, 3) for c in ours]
  assert [srt.srt_timestamp_to_timedelta(t[0]) for t in timings] == [s.start for s in theirs]
  assert [srt.srt_timestamp_to_timedelta(t[2]) for t in timings] == [s.end for s in theirs]
  assert [t[3] if len(t) > 3 else "" for t in timings] == [s.proprietary for s in theirs]
  assert ["\n".join(c.lines) for c in ours] == [s.content for s in theirs]
  # Translated, it is still SRT, with the same numbers and times.
  again = list(srt.parse(formats.translate_srt(source, mark)))
  assert [(s.index, s.start, s.end) for s in again] == [(s.index, s.start, s.end) for s in theirs]


@settings(max_examples=100, deadline=None)
@given(ANY_TEXT)
def test_srt_any_text_is_an_answer_or_a_value_error(source):
  try:
    formats.translate_srt(source, mark)
  except ValueError as e:
    assert str(e).startswith("invalid SRT")


# ---------------------------------------------------------------------- plain text, files


def test_txt_lines_by_themselves_blank_lines_and_spaces_kept():
  translate = Counting()
  source = "First line.\n\n  indented \r\n \t\nlast"
  assert formats.translate_txt(source, translate) == "[FIRST LINE.]\n\n  [INDENTED] \r\n \t\n[LAST]"
  assert translate.calls == [["First line.", "indented", "last"]]
  blank = Counting()
  assert formats.translate_txt("\n \n", blank) == "\n \n"
  assert blank.calls == []


@given(ANY_TEXT)
def test_txt_identity_gives_the_text_back(source):
  assert formats.translate_txt(source, identity) == source


@pytest.mark.parametrize(
  "name, extension",
  [("a.txt", ".txt"), ("A.HTML", ".html"), ("x.y.htm", ".htm"), ("dir.d/s.srt", ".srt")],
)
def test_extension_of_supported(name, extension):
  assert formats.extension_of(name) == extension


@pytest.mark.parametrize(
  "name", ["a.pdf", "noext", ".txt", "a.txt/", "a.txt.exe", "a." + "x" * 500]
)
def test_extension_of_unsupported_names_the_supported(name):
  with pytest.raises(ValueError, match="file format not supported") as e:
    formats.extension_of(name)
  assert "(supported: .htm, .html, .srt, .txt)" in str(e.value)
  assert len(str(e.value)) < 200


def test_decode_upload_utf8_with_or_without_bom():
  assert formats.decode_upload("Zoë".encode(), ".txt") == ("Zoë", False)
  assert formats.decode_upload(formats.BOM + "Zoë".encode(), ".srt") == ("Zoë", True)


@pytest.mark.parametrize(
  "data, extension, message",
  [
    (
      "Zoë!".encode("latin-1"),
      ".txt",
      "the text file is not UTF-8 text (invalid continuation byte at byte 2)",
    ),
    (
      formats.BOM + b"ab\xff",
      ".srt",
      "the SRT file is not UTF-8 text (invalid start byte at byte 5)",
    ),
    ("<p>x</p>".encode("utf-16"), ".html", "the HTML file is not UTF-8 text"),
    (
      "<p>x</p>".encode("utf-16-le"),
      ".html",
      "the HTML file holds a NUL character (at character 1)",
    ),
    (b"\xed\xa0\x80", ".txt", "not UTF-8 text"),  # an encoded lone surrogate
  ],
)
def test_decode_upload_refusals_name_the_file_kind(data, extension, message):
  with pytest.raises(ValueError) as e:
    formats.decode_upload(data, extension)
  assert message in str(e.value)


def test_translate_file_html_and_txt():
  out, media_type = formats.translate_file(b"<p>hi</p>", "page.html", mark)
  assert (out, media_type) == (b"<p>[HI]</p>", "text/html; charset=utf-8")
  out, media_type = formats.translate_file(b"a\n\nb", "notes.txt", mark)
  assert (out, media_type) == (b"[A]\n\n[B]", "text/plain; charset=utf-8")
  # A translator's lone surrogate is written as '?', not an exception.
  out, _ = formats.translate_file(b"a", "n.txt", lambda texts: ["\ud800"])
  assert out == b"?"
