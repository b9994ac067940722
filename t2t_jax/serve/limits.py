"""Request rate limits and per-key limits, as LibreTranslate's --req-limit and its api_keys
database rows (key -> req_limit, char_limit) have them; pure, so that every rule is testable
with a fake clock (tests/test_serve_limits.py).

A client is counted by the string the server gives (its socket address), a request with a
key that has its own req_limit by that key, wherever it comes from (LibreTranslate's
limiter counts a request by its api_key when it has one). Each counter is a fixed window of
60 s opened by the counter's first request: the limits library's FixedWindowRateLimiter on
a storage of its own kind here, which reads an injected clock and drops ended windows at
most once a window, so that a server that met thousands of clients holds the counters of
the last two windows' clients only. -1 is no limit, as in LibreTranslate.

Keys file lines (--api_keys): `KEY`, or `KEY req_limit=N char_limit=M` with either field
left out for the server's own limit; blank lines and lines starting with '#' are skipped.

The `limits` library is imported when a RateLimiter is made, not with this module: the keys
file is read (and its mistakes reported) before the server's other imports.
"""

import dataclasses
import functools
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

WINDOW_S = 60  # LibreTranslate's --req-limit is per minute
UNLIMITED = -1
KEY_FIELDS = ("req_limit", "char_limit")


class RateLimited(Exception):  # noqa: N818 (a refusal, named as the server maps it: 429)
  """A request over its client's (or key's) limit: 429 with {"error": message} and
  Retry-After (`retry_after_header`), `retry_after_s` the time until its window ends."""

  def __init__(self, retry_after_s: float, message: str) -> None:
    super().__init__(message)
    self.retry_after_s = retry_after_s
    self.message = message

  @property
  def retry_after_header(self) -> str:
    """Retry-After's value: whole seconds (RFC 9110), rounded up, at least 1."""
    return str(max(1, -int(-self.retry_after_s // 1)))


@dataclasses.dataclass(frozen=True)
class KeyLimits:
  """A key's own limits (None: the server's); LibreTranslate's api_keys row."""

  req_limit: int | None = None  # requests per minute, -1: no limit
  char_limit: int | None = None  # characters of a request, -1: no limit


def _limit_value(text: str, field: str, at: str) -> int:
  if not re.fullmatch(r"-?[0-9]+", text):
    raise ValueError(f"{at}: {field}={text!r} is not a whole number")
  value = int(text)
  if value < -1 or value == 0:
    what = "request" if field == "req_limit" else "text"
    raise ValueError(
      f"{at}: {field}={value} would refuse every {what}: it must be >= 1 (-1: no limit; "
      f"leave {field} out for the server's own limit)"
    )
  return value


def read_key_limits(lines: Sequence[str], name: str) -> dict[str, KeyLimits]:
  """The keys of a keys file and their limits: `KEY` or `KEY req_limit=N char_limit=M`
  a line. A key given twice with the same limits is one key; with others, an error. Errors
  name the file and the line (`--api_keys=FILE:LINE: ...`), never the key itself."""
  found: dict[str, KeyLimits] = {}
  first_line: dict[str, int] = {}
  for number, line in enumerate(lines, 1):
    text = line.strip()
    if not text or text.startswith("#"):
      continue
    at = f"--api_keys={name}:{number}"
    key, *fields = text.split()
    if key.partition("=")[0] in KEY_FIELDS:
      raise ValueError(f"{at}: the line starts with a limit; the key comes first (KEY {key})")
    values: dict[str, int] = {}
    for field in fields:
      field_name, equals, value = field.partition("=")
      if not equals or field_name not in KEY_FIELDS:
        raise ValueError(f"{at}: {field!r} is not req_limit=N or char_limit=N")
      if field_name in values:
        raise ValueError(f"{at}: {field_name} is given twice")
      values[field_name] = _limit_value(value, field_name, at)
    limits = KeyLimits(**values)
    if key in found and found[key] != limits:
      raise ValueError(f"{at}: the key of line {first_line[key]} again, with other limits")
    found.setdefault(key, limits)
    first_line.setdefault(key, number)
  if not found:
    raise ValueError(f"--api_keys={name}: no key in the file (one key a line)")
  return found


def req_limits_of(keys: Mapping[str, KeyLimits]) -> dict[str, int]:
  """RateLimiter's `per_key`: the keys that have a req_limit of their own."""
  return {k: v.req_limit for k, v in keys.items() if v.req_limit is not None}


def char_limit_of(key: Any, keys: Mapping[str, KeyLimits] | None, default: int) -> int:
  """A request's character limit (LibreTranslate's get_char_limit): its key's own
  char_limit when the key is listed with one, else the server's `default`."""
  if keys is None or not isinstance(key, str) or key not in keys:
    return default
  own = keys[key].char_limit
  return default if own is None else own


@functools.cache
def _window_counts() -> type:
  """The storage class (made once, on first use: it subclasses the limits library's)."""
  import limits.storage

  class WindowCounts(limits.storage.Storage):
    """limits' fixed-window storage contract (incr, get, get_expiry) in a dict of
    key -> [count, window end] read on `clock`; the windows that ended are dropped by the
    first incr after each `sweep_every_s`, so the dict holds the last two windows' keys."""

    STORAGE_SCHEME = None  # not a storage URI scheme: made here only

    def __init__(self, clock: Callable[[], float], sweep_every_s: float) -> None:
      super().__init__()
      self.clock = clock
      self.sweep_every_s = sweep_every_s
      self.counts: dict[str, list[float]] = {}
      self.next_sweep = clock() + sweep_every_s

    @property
    def base_exceptions(self) -> type[Exception]:
      return ValueError

    def _live(self, key: str, now: float) -> list[float] | None:
      entry = self.counts.get(key)
      if entry is not None and entry[1] <= now:
        del self.counts[key]
        return None
      return entry

    def _sweep(self, now: float) -> None:
      if now < self.next_sweep:
        return
      self.counts = {k: e for k, e in self.counts.items() if e[1] > now}
      self.next_sweep = now + self.sweep_every_s

    def incr(self, key: str, expiry: float, amount: int = 1, **_: Any) -> int:
      # (limits < 5 also passes elastic_expiry=False)
      now = self.clock()
      self._sweep(now)
      entry = self._live(key, now)
      if entry is None:
        entry = self.counts[key] = [0, now + expiry]
      entry[0] += amount
      return int(entry[0])

    def get(self, key: str) -> int:
      entry = self._live(key, self.clock())
      return 0 if entry is None else int(entry[0])

    def get_expiry(self, key: str) -> float:
      now = self.clock()
      entry = self._live(key, now)
      return now if entry is None else entry[1]

    def check(self) -> bool:
      return True

    def reset(self) -> int:
      count = len(self.counts)
      self.counts.clear()
      return count

    def clear(self, key: str) -> None:
      self.counts.pop(key, None)

  return WindowCounts


def _check_limit(value: Any, what: str) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or not (value >= 1 or value == -1):
    raise ValueError(f"{what} must be a whole number >= 1 (-1: no limit), not {value!r}")
  return value


class RateLimiter:
  """At most `per_minute` requests a client in each 60 s window (-1: no limit); a request
  whose key is in `per_key` counts against that key's own limit instead, shared by every
  client using the key. Thread-safe: a hit's check and count are one step under a lock."""

  def __init__(
    self,
    per_minute: int,
    per_key: Mapping[str, int] | None = None,
    clock: Callable[[], float] | None = None,
  ) -> None:
    from limits import RateLimitItemPerMinute
    from limits.strategies import FixedWindowRateLimiter

    self.per_minute = _check_limit(per_minute, "per_minute")
    self.per_key = {k: _check_limit(v, "a key's req_limit") for k, v in (per_key or {}).items()}
    self._clock = clock or time.monotonic
    self._storage = _window_counts()(self._clock, WINDOW_S)
    self._window = FixedWindowRateLimiter(self._storage)
    self._item = functools.cache(RateLimitItemPerMinute)  # one per limit met
    self._lock = threading.Lock()

  def counted_as(self, client: str, key: Any) -> tuple[str, int]:
    """(what a request is counted as, its limit a minute): its key when the key has a
    limit of its own, else its client with the server's limit."""
    if isinstance(key, str) and key in self.per_key:
      return "key:" + key, self.per_key[key]
    return "client:" + client, self.per_minute

  def hit(self, client: str, key: Any = None, cost: int = 1) -> None:
    """Counts a request of `client` (with `key`, if any), or raises RateLimited when its
    window is used up; a refused request is not counted. A request passes while one
    request is left in its window and counts `cost` (LibreTranslate counts a list `q` as
    len(q) requests, checked before and counted after), so a large batch is never refused
    for good but uses up the window."""
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
      raise ValueError(f"cost={cost!r} must be a whole number >= 1")
    counted, limit = self.counted_as(client, key)
    if limit == UNLIMITED:
      return
    item = self._item(limit)
    with self._lock:
      if not self._window.test(item, counted):
        now = self._clock()
        ends = self._window.get_window_stats(item, counted).reset_time
        retry = ends - now if ends > now else float(WINDOW_S)
        raise RateLimited(min(retry, float(WINDOW_S)), f"Slowdown: {item}")
      self._window.hit(item, counted, cost=cost)

  def counters(self) -> int:
    """How many counters the storage holds (ended windows not yet dropped included)."""
    with self._lock:
      return len(self._storage.counts)
