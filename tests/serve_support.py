"""What the t2t-serve tests share: a plain HTTP client (http.client: the requests exactly as
written, bad bytes included), a stand-in model, the app in a thread of the test process,
and the real `t2t-serve` process."""

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from tests import support


class Answer(NamedTuple):
  status: int
  headers: dict[str, str]
  body: bytes

  @property
  def json(self) -> Any:
    return json.loads(self.body)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def call(
  port: int,
  method: str,
  path: str,
  body: bytes | str | dict | None = None,
  content_type: str | None = None,
  timeout: float = 60,
  headers: dict | None = None,
) -> Answer:
  """One request; a dict body is sent as JSON."""
  if isinstance(body, dict):
    body, content_type = json.dumps(body), content_type or "application/json"
  if isinstance(body, str):
    body = body.encode()
  conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
  try:
    sent = dict(headers or {})
    if content_type:
      sent["Content-Type"] = content_type
    conn.request(method, path, body=body, headers=sent)
    response = conn.getresponse()
    return Answer(
      response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    )
  finally:
    conn.close()


def translate(port: int, **fields: Any) -> Answer:
  return call(port, "POST", "/translate", dict(dict(source="en", target="de"), **fields))


class Hyp(NamedTuple):
  text: str
  score: float
  log_prob: float


class FakeModel:
  """A stand-in with the served model's surface: each word reversed, the words in reverse
  order; n-best r: the same with '~r' added; load() waits for `release` (readiness)."""

  def __init__(
    self,
    delay: float = 0.0,
    loaded: bool = True,
    pair: str = "en-de",
    mark: str = "",
    fail_on: str | None = None,
    max_tokens: int | None = None,
  ) -> None:
    from t2t_jax.serve.api import Pair

    self.pair = Pair(*pair.split("-"))
    self.mark = mark  # put before every answer: which model answered
    self.fail_on = fail_on  # a batch holding a line with this text raises, as a bad line would
    if max_tokens is not None:  # the served model's source budget, in words here
      self.max_tokens = max_tokens
      self.count_tokens = lambda text: len(text.split())
    self.beam_size = 4
    self.delay = delay
    self.release = threading.Event()
    if loaded:
      self.release.set()
    self.calls: list[list[str]] = []
    self.gate = threading.Event()  # translate() waits for it: clear it to hold the model
    self.gate.set()

  def load(self) -> None:
    self.release.wait()

  def answer(self, line: str) -> str:
    return self.mark + " ".join(word[::-1] for word in reversed(line.split()))

  def translate(self, lines: list[str], nbest: int = 0) -> list[Any]:
    self.calls.append(list(lines))
    self.gate.wait()
    if self.fail_on is not None and any(self.fail_on in line for line in lines):
      raise RuntimeError(f"cannot translate {self.fail_on!r}")
    time.sleep(self.delay)
    if not nbest:
      return [self.answer(line) for line in lines]
    return [
      [
        Hyp(self.answer(line) + ("" if r == 0 else f" ~{r}"), -0.5 * r, -1.0 * r)
        for r in range(nbest)
      ]
      for line in lines
    ]

  def attention(self, source: str, target: str) -> dict:
    src, tgt = source.split() + ["</s>"], target.split() + ["</s>"]
    row = [1.0 / len(src)] * len(src)
    return dict(source_tokens=src, target_tokens=tgt, cross=[[[row] * len(tgt)] * 2] * 3)


@contextlib.contextmanager
def in_process(model: Any, **settings: Any) -> Iterator[int]:
  """The app on uvicorn in a thread of this process, on a free port; yields the port."""
  import uvicorn

  from t2t_jax.serve import app

  server = app.Server(model, app.ServerSettings(**settings))
  port = free_port()
  config = uvicorn.Config(app.create_app(server), host="127.0.0.1", port=port, log_level="error")
  runner = uvicorn.Server(config)
  thread = threading.Thread(target=runner.run, daemon=True)
  thread.start()
  wait_for(port, "/health")
  try:
    yield port
  finally:
    runner.should_exit = True
    thread.join(30)


def wait_for(port: int, path: str, timeout: float = 300, proc: Any = None) -> None:
  """Until GET path answers 200 (the process, when given, must stay alive)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc is not None and proc.poll() is not None:
      raise RuntimeError(f"t2t-serve exited {proc.returncode}:\n{proc.stderr.read()[-3000:]}")
    with contextlib.suppress(OSError, http.client.HTTPException):
      if call(port, "GET", path, timeout=5).status == 200:
        return
    time.sleep(0.2)
  raise TimeoutError(f"GET {path} did not answer 200 within {timeout}s")


def start_serve(workdir: str, port: int, *flags: str) -> subprocess.Popen:
  """`t2t-serve` as a user runs it (python -m, the test run's compilation cache)."""
  env = support.cpu_env(T2T_HUGE_PAGES="0")
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
  return subprocess.Popen(
    [sys.executable, "-m", "t2t_jax.cli.serve", f"--workdir={workdir}", f"--port={port}", *flags],
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
