"""t2t-serve: LibreTranslate's fields and answers, the lines of a text, keys, batching."""

from tools.mutations import Mutation

M = Mutation
API = "t2t_jax/serve/api.py"
FIRST = ("tests/test_serve_api.py", "tests/test_serve_http.py")
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
)
