"""t2t-serve's sentences: a text taken apart into sentences and pieces and put back."""

from tools.mutations import Mutation

M = Mutation
SEGMENT = "t2t_jax/serve/segment.py"
FIRST = ("tests/test_serve_segment.py",)
MUTATIONS = (
  M(
    "segment_gap_dropped",
    "sentences of a line are joined with nothing instead of the whitespace between them",
    SEGMENT,
    "layout.append(Gap(line[spans[j - 1][1] : start]))",
    'layout.append(Gap(""))',
    FIRST,
  ),
  M(
    "segment_budget_off_by_one",
    "a piece of max_tokens + 1 tokens counts as within the budget: <= max_tokens + 1",
    SEGMENT,
    "fits = lambda text: count_tokens(text) <= max_tokens",
    "fits = lambda text: count_tokens(text) <= max_tokens + 1",
    FIRST,
  ),
  M(
    "segment_line_end_whitespace_lost",
    "a line's trailing whitespace of one character is dropped: < len(line) becomes - 1",
    SEGMENT,
    "if spans[-1][1] < len(line):",
    "if spans[-1][1] < len(line) - 1:",
    FIRST,
  ),
  M(
    "segment_word_gap_as_one_space",
    "the pieces of a cut sentence are joined by one space, not the tab or spaces between them",
    SEGMENT,
    "gaps.append(Gap(sentence[ends[i - 1] : starts[i]]))",
    'gaps.append(Gap(" "))',
    FIRST,
  ),
  M(
    "segment_region_read_as_english",
    "'de-AT' goes to sentencex whole, which reads it with English rules ('3. Oktober' split)",
    SEGMENT,
    'return re.split(r"[-_]", language.strip().lower(), maxsplit=1)[0] or "en"',
    'return language.strip().lower() or "en"',
    FIRST,
  ),
  M(
    "segment_surrogate_unguarded",
    "a line with a lone surrogate goes to sentencex as it is, which refuses it: one sentence",
    SEGMENT,
    'readable = _SURROGATE.sub("\\ufffd", line)',
    "readable = line",
    FIRST,
  ),
  M(
    "segment_space_into_chinese",
    "a translation into Chinese keeps the spaces between the source's sentences",
    SEGMENT,
    'return "" if gap.text.strip(" ") == "" else gap.text',
    "return gap.text",
    FIRST,
  ),
)
