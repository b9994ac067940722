"""t2t-serve: LibreTranslate's fields and answers, the lines of a text, keys, batching."""

from tools.mutations import Mutation

M = Mutation
API = "t2t_jax/serve/api.py"
FIRST = ("tests/test_serve_api.py", "tests/test_serve_http.py")
WARM_UP = ("tests/test_serve_warm_up.py",)
MUTATIONS = (
  M(
    "serve_list_q_as_string",
    "a list q is answered by its first translation, a string",
    API,
    '"translatedText": list(best) if request.is_list else best[0]',
    '"translatedText": best[0] if request.is_list else best[0]',
    FIRST,
  ),
  M(
    "serve_empty_lines_dropped",
    "a text's blank lines are dropped when its lines are put back",
    API,
    "found = [next(it) if translatable(line) else None for line in split_lines(text)]",
    "found = [next(it) for line in split_lines(text) if translatable(line)]",
    FIRST,
  ),
  M(
    "serve_blank_line_translated",
    "a line of spaces goes to the model instead of coming back empty",
    API,
    "return bool(line.strip())",
    "return bool(line)",
    FIRST,
  ),
  M(
    "serve_any_key_accepted",
    "with a keys file, any key given is accepted: or becomes and",
    API,
    "if not isinstance(given, str) or not any(",
    "if not isinstance(given, str) and not any(",
    FIRST,
  ),
  M(
    "serve_batch_mixes_answers",
    "each request of a batch gets the batch's first results, not its own",
    "t2t_jax/serve/batching.py",
    "out.append(list(results[start : start + count]))",
    "out.append(list(results[:count]))",
    FIRST,
  ),
  M(
    "serve_form_overrides_query",
    "the form body's value replaces the query's (werkzeug's request.values: first wins)",
    API,
    "      out.setdefault(name, value)\n  return out\n\n\ndef normalise",
    "      out[name] = value\n  return out\n\n\ndef normalise",
    FIRST,
  ),
  M(
    "serve_char_limit_off_by_one",
    "a text of exactly char_limit characters is refused: > becomes >=",
    API,
    "if limits.char_limit != -1 and chars > limits.char_limit:",
    "if limits.char_limit != -1 and chars >= limits.char_limit:",
    FIRST,
  ),
  M(
    "serve_alternatives_uncapped",
    "alternatives=10000 is accepted (LibreTranslate hung on it): != becomes ==",
    API,
    "if limit != -1 and count > limit:",
    "if limit == -1 and count > limit:",
    FIRST,
  ),
  M(
    "serve_no_cors",
    "answers lose LibreTranslate's CORS header (browser tools cannot call the API)",
    "t2t_jax/serve/app.py",
    '"Access-Control-Allow-Origin": "*"',
    '"Access-Control-Allow-Origin-Off": "*"',
    ("tests/test_serve_http.py",),
  ),
  M(
    "serve_warm_up_misses_a_compaction",
    "the warm-up's stage table leaves out compacting to size // 2 rows: programs compile later",
    "t2t_jax/decoding/stages.py",
    "running = range(1, self.until(move.size) + 1)",
    "running = range(1, self.until(move.size))",
    WARM_UP,
  ),
  M(
    "serve_warm_up_rows_of_its_own_bucket",
    "batch_shapes bounds a bucket's rows by its own length, not the bucket below: too few rows",
    "t2t_jax/decoding/batching.py",
    "count = max(1, batch_tokens // (below + 1))",
    "count = max(1, batch_tokens // (bucket + 1))",
    WARM_UP,
  ),
  M(
    "serve_max_rows_off_by_one",
    "translate() puts max_rows + 1 sentences in a batch: < becomes <=",
    "t2t_jax/decoding/batching.py",
    "while start + n < len(order) and (max_rows is None or n < max_rows):",
    "while start + n < len(order) and (max_rows is None or n <= max_rows):",
    WARM_UP,
  ),
  M(
    "serve_warm_up_grows_only_the_full_batch",
    "the warm-up resizes the cache of the full batch only: a compacted batch compiles its resize",
    "t2t_jax/decoding/stages.py",
    "if (grown := self.growth(move)) is not None:",
    "if (grown := self.growth(move)) is not None and move.size == batch_size:",
    WARM_UP,
  ),
  M(
    "serve_warm_up_skips_nbest_scoring",
    "the n-best scores' host-side length penalty is not compiled in the warm-up",
    "t2t_jax/decoding/translator.py",
    "      hypotheses_lib.warm_up_hypotheses(settings.alpha)",
    "      pass",
    WARM_UP,
  ),
)
