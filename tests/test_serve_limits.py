"""t2t-serve's request limits as pure functions, on a fake clock (no sleeping): N requests a
minute pass and the next is refused until its window ends, per-key limits, -1, the keys
file's lines and their errors, exact counts under threads, and the counters of ended
windows dropped (thousands of clients leave none behind)."""

import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t2t_jax.serve import limits

T0 = 1000.0


class Clock:
  def __init__(self, now: float = T0) -> None:
    self.now = now

  def __call__(self) -> float:
    return self.now


@pytest.fixture()
def clock():
  pytest.importorskip("limits")
  return Clock()


def refused(limiter: limits.RateLimiter, client: str, key: str | None = None) -> limits.RateLimited:
  with pytest.raises(limits.RateLimited) as e:
    limiter.hit(client, key)
  return e.value


@pytest.mark.parametrize("n", [1, 3, 60])
def test_n_requests_pass_and_the_next_is_refused_until_the_window_ends(clock, n):
  limiter = limits.RateLimiter(n, clock=clock)
  for _ in range(n):
    limiter.hit("10.0.0.1", None)
  e = refused(limiter, "10.0.0.1")
  assert 0 < e.retry_after_s <= 60
  assert e.retry_after_s == 60
  assert e.message == f"Slowdown: {n} per 1 minute"  # LibreTranslate's 429 error
  assert e.retry_after_header == "60"
  clock.now = T0 + 45.5
  e = refused(limiter, "10.0.0.1")
  assert e.retry_after_s == pytest.approx(14.5)
  assert e.retry_after_header == "15"
  clock.now = T0 + 59.999
  assert 0 < refused(limiter, "10.0.0.1").retry_after_s <= 0.01
  clock.now = T0 + 60  # the window's end: a new window, n requests again
  for _ in range(n):
    limiter.hit("10.0.0.1", None)
  assert refused(limiter, "10.0.0.1").retry_after_s == 60


def test_a_window_opens_at_its_first_request_and_refused_requests_do_not_count(clock):
  limiter = limits.RateLimiter(2, clock=clock)
  clock.now = T0 + 10
  limiter.hit("a")
  clock.now = T0 + 50
  limiter.hit("a")
  for _ in range(5):
    assert refused(limiter, "a").retry_after_s == pytest.approx(20)
  clock.now = T0 + 70
  limiter.hit("a")
  limiter.hit("a")
  refused(limiter, "a")


def test_clients_are_counted_apart(clock):
  limiter = limits.RateLimiter(2, clock=clock)
  limiter.hit("a")
  limiter.hit("a")
  refused(limiter, "a")
  limiter.hit("b")
  limiter.hit("b")
  refused(limiter, "b")


def test_a_keys_own_limit_replaces_the_clients_and_is_shared_by_its_clients(clock):
  limiter = limits.RateLimiter(2, {"gold": 5, "open": -1}, clock=clock)
  for client in ("a", "a", "b", "c", "a"):
    limiter.hit(client, "gold")
  assert refused(limiter, "d", "gold").message == "Slowdown: 5 per 1 minute"
  assert refused(limiter, "a", "gold").message == "Slowdown: 5 per 1 minute"
  # Without the key (or with a key that has no limit of its own) a client has the server's.
  for key in (None, "plain"):
    limiter.hit("e", key)
  assert refused(limiter, "e", None).message == "Slowdown: 2 per 1 minute"
  assert refused(limiter, "e", "plain").message == "Slowdown: 2 per 1 minute"
  limiter.hit("a")  # a's own counter is not the key's
  for _ in range(1000):
    limiter.hit("e", "open")
  for odd in (["gold"], {"k": 1}, 5):  # a JSON api_key of another type: the client's limit
    assert limiter.counted_as("e", odd) == ("client:e", 2)
  assert limiter.counted_as("e", "gold") == ("key:gold", 5)
  assert limiter.counted_as("e", "plain") == ("client:e", 2)


def test_minus_one_is_no_limit(clock):
  limiter = limits.RateLimiter(-1, {"k": 1}, clock=clock)
  for i in range(5000):
    limiter.hit("a")
    limiter.hit(f"c{i}")
  assert limiter.counters() == 0  # nothing is counted without a limit
  limiter.hit("a", "k")
  refused(limiter, "b", "k")


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3", None])
def test_a_limit_is_at_least_one_or_minus_one(clock, bad):
  with pytest.raises(ValueError, match="must be a whole number >= 1"):
    limits.RateLimiter(bad, clock=clock)
  with pytest.raises(ValueError, match="a key's req_limit") as e:
    limits.RateLimiter(5, {"s3cr3t": bad}, clock=clock)
  assert "s3cr3t" not in str(e.value)


def test_a_request_of_many_texts_costs_as_many_and_is_never_refused_for_good(clock):
  limiter = limits.RateLimiter(10, clock=clock)
  limiter.hit("a", cost=8)
  limiter.hit("a", cost=8)  # two were left: it passes, and uses up the window
  refused(limiter, "a")
  clock.now = T0 + 60
  limiter.hit("a", cost=50)  # more than the limit: passes at a window's start
  refused(limiter, "a")
  for cost in (0, -1, 1.0, True):
    with pytest.raises(ValueError, match="cost"):
      limiter.hit("a", cost=cost)


def test_the_default_clock_counts_a_minute():
  pytest.importorskip("limits")
  limiter = limits.RateLimiter(1)
  limiter.hit("a")
  assert 59 < refused(limiter, "a").retry_after_s <= 60


@pytest.mark.parametrize("seconds, header", [(0.01, "1"), (1.0, "1"), (59.01, "60"), (60, "60")])
def test_retry_after_is_whole_seconds_rounded_up(seconds, header):
  assert limits.RateLimited(seconds, "x").retry_after_header == header


def one_round(limiter: limits.RateLimiter, threads: int, each: int) -> tuple[int, int]:
  """(passed, refused) of `threads` threads sending `each` requests of one client at once."""
  passed, failed = [], []
  start = threading.Barrier(threads)

  def client():
    start.wait()
    for _ in range(each):
      try:
        limiter.hit("10.0.0.1")
        passed.append(1)
      except limits.RateLimited:
        failed.append(1)

  running = [threading.Thread(target=client) for _ in range(threads)]
  for t in running:
    t.start()
  for t in running:
    t.join()
  return len(passed), len(failed)


def test_threads_hitting_one_client_are_counted_exactly(clock):
  """16 threads, 100 requests each, a limit of 500: exactly 500 pass, in each of ten windows
  (without the lock, a round miscounts about two times in three)."""
  limiter = limits.RateLimiter(500, clock=clock)
  switch = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)  # interleave the threads as often as the interpreter can
  try:
    for window in range(10):
      clock.now = T0 + 60 * window
      assert (window, *one_round(limiter, 16, 100)) == (window, 500, 1100)
  finally:
    sys.setswitchinterval(switch)


def test_ended_windows_leave_no_counters_behind(clock):
  limiter = limits.RateLimiter(3, {"k": 2}, clock=clock)
  for i in range(10_000):
    limiter.hit(f"10.{i // 256}.{i % 256}.1")
  limiter.hit("x", "k")
  assert limiter.counters() == 10_001
  clock.now = T0 + 61
  limiter.hit("late")
  assert limiter.counters() == 1
  # Clients coming and going for ten windows: only the last two windows' stay.
  for window in range(10):
    for i in range(1000):
      clock.now = T0 + 120 + 60 * window + i * 0.06
      limiter.hit(f"w{window}-{i}")
      assert limiter.counters() <= 2001
  assert limiter.counters() >= 1000


# The keys file.

NAME = "keys.txt"


def one_key_a_line(lines, name):
  """The keys file as it was read before it could carry limits: the reference that a file
  without limits must still read as."""
  keys = frozenset(k.strip() for k in lines if k.strip() and not k.strip().startswith("#"))
  if not keys:
    raise ValueError(f"--api_keys={name}: no key in the file (one key a line)")
  return keys


def test_a_file_of_plain_keys_reads_as_before():
  lines = ["alpha", "", "   ", "# a comment", "  beta  ", "alpha", "\tgamma"]
  found = limits.read_key_limits(lines, NAME)
  assert found == {k: limits.KeyLimits() for k in ("alpha", "beta", "gamma")}
  assert frozenset(found) == one_key_a_line(lines, NAME)


key_text = st.text(alphabet=st.characters(blacklist_categories=("Z", "C")), min_size=1)
line_of = st.one_of(key_text, st.just(""), st.just("  "), key_text.map(lambda k: "#" + k))


@settings(max_examples=200, deadline=None)
@given(st.lists(line_of.map(lambda k: f" {k} "), max_size=8))
def test_the_keys_of_a_file_without_limits_are_the_one_key_a_line_readers(lines):
  try:
    expected = one_key_a_line(lines, NAME)
  except ValueError as e:
    with pytest.raises(ValueError) as got:
      limits.read_key_limits(lines, NAME)
    assert str(got.value) == str(e)
    return
  if any(k.strip().partition("=")[0] in limits.KEY_FIELDS for k in lines):
    return  # a key spelled like a limit is refused now
  assert frozenset(limits.read_key_limits(lines, NAME)) == expected


def test_limits_on_a_keys_line():
  lines = [
    "# key req_limit=N char_limit=M",
    "gold req_limit=120 char_limit=20000",
    "silver   char_limit=-1",
    "bronze req_limit=-1",
    "tin char_limit=300 req_limit=5",
    "gold req_limit=120 char_limit=20000",  # the same again: one key
  ]
  assert limits.read_key_limits(lines, NAME) == {
    "gold": limits.KeyLimits(req_limit=120, char_limit=20000),
    "silver": limits.KeyLimits(char_limit=-1),
    "bronze": limits.KeyLimits(req_limit=-1),
    "tin": limits.KeyLimits(req_limit=5, char_limit=300),
  }


@pytest.mark.parametrize(
  "line, problem",
  [
    ("s3cr3t req_limit=ten", "req_limit='ten' is not a whole number"),
    ("s3cr3t req_limit=+5", "req_limit='+5' is not a whole number"),
    ("s3cr3t char_limit=1_000", "char_limit='1_000' is not a whole number"),
    ("s3cr3t req_limit=", "req_limit='' is not a whole number"),
    ("s3cr3t req_limit=0", "req_limit=0 would refuse every request: it must be >= 1"),
    ("s3cr3t char_limit=0", "char_limit=0 would refuse every text: it must be >= 1"),
    ("s3cr3t req_limit=-2", "req_limit=-2 would refuse every request"),
    ("s3cr3t rate=5", "'rate=5' is not req_limit=N or char_limit=N"),
    ("s3cr3t req_limit", "'req_limit' is not req_limit=N or char_limit=N"),
    ("s3cr3t req_limit=1 req_limit=2", "req_limit is given twice"),
    ("req_limit=5 s3cr3t", "the line starts with a limit; the key comes first"),
    ("s3cr3t req_limit=7", "the key of line 2 again, with other limits"),
  ],
)
def test_a_wrong_line_is_named_by_file_and_line_and_the_key_is_not_shown(line, problem):
  lines = ["first", "s3cr3t req_limit=9", "# comment", line, "last"]
  with pytest.raises(ValueError) as e:
    limits.read_key_limits(lines, NAME)
  message = str(e.value)
  assert message.startswith(f"--api_keys={NAME}:4: "), message
  assert problem in message
  assert "s3cr3t" not in message


@pytest.mark.parametrize("lines", [[], [""], ["# only a comment", "  "]])
def test_a_file_without_a_key_is_refused(lines):
  with pytest.raises(ValueError, match=f"--api_keys={NAME}: no key in the file"):
    limits.read_key_limits(lines, NAME)


def test_char_limit_of_a_key_and_req_limits_of_the_keys():
  keys = limits.read_key_limits(
    ["gold req_limit=60 char_limit=9000", "plain", "open char_limit=-1"], NAME
  )
  assert limits.char_limit_of("gold", keys, 5000) == 9000
  assert limits.char_limit_of("open", keys, 5000) == -1
  assert limits.char_limit_of("plain", keys, 5000) == 5000
  assert limits.char_limit_of("unknown", keys, 5000) == 5000
  assert limits.char_limit_of(None, keys, 5000) == 5000
  assert limits.char_limit_of(["gold"], keys, 5000) == 5000
  assert limits.char_limit_of("gold", None, 5000) == 5000
  assert limits.req_limits_of(keys) == {"gold": 60}


def test_the_keys_file_is_read_without_the_limits_library():
  """cli/serve.py reads the keys file before the serve extra's imports."""
  import subprocess

  code = (
    "import sys; sys.modules['limits'] = None\n"
    "from t2t_jax.serve import limits\n"
    "print(sorted(limits.read_key_limits(['a req_limit=3', 'b'], 'f')))"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "['a', 'b']"
