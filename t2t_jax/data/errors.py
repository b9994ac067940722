"""The one exception type for bad data input, so callers and tests can catch it precisely."""


class DataError(ValueError):
  """Bad input data or data config; the message names the file, line or config flag."""
