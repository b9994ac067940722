"""t2t-bench --parts=serve: t2t-serve under load against calling the Translator directly.

    t2t-bench --parts=serve --workdir=DIR [--serve_clients=1,4,16,64] [--serve_requests=256]

Starts two `t2t-serve` processes on the workdir, one batching concurrent requests (the
default window) and one with batching off (--max_batch_chars=1: every batch is one
request), and sends one-sentence LibreTranslate requests from 1, 4, 16 and 64 concurrent
clients (threads, one connection per request) in a closed loop: requests/s and p50/p95
latency per client count. The batching gain is the ratio of the two servers' requests/s
at 16 clients, measured alternately (A, B, A, B) so that other load on the machine falls
on both. Direct: the same model (serve.worker.Model) translating the sentences one call
each, and all in one call, without HTTP. The servers' resident memory before and after all
the requests shows whether thousands of requests make it grow.
"""

import concurrent.futures
import http.client
import json
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from t2t_jax.bench import inputs


def sentences_for(workdir: str, n: int, input_path: str | None = None) -> tuple[list[str], str]:
  """(n source sentences, where from): --decode_input, else the workdir's own test split
  (any source: a synthetic task generates its own), else multi30k test2016 / newstest2014 from
  the shared data."""
  from t2t_jax.data import DataError, sources
  from t2t_jax.translate import load_config

  if input_path:
    with open(input_path, encoding="utf-8") as f:
      return [line.rstrip("\n") for line in f if line.strip()][:n], input_path
  data = load_config(workdir).data
  try:
    test = sources.open_splits(data, workdir)["test"]
  except (DataError, OSError):  # its corpus is not on this machine: the shared data below
    test = None
  if test is not None and len(test):
    pairs = test.read(list(range(min(n, len(test)))))
    return [src for src, _ in pairs], f"{data.source} test split of {workdir}"
  found, name = inputs.real_sentences(n)
  if found is None:
    raise SystemExit("t2t-bench: no sentences for --parts=serve: give --decode_input=FILE")
  return found, name


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class _ServerProcess:
  """A t2t-serve child process on a free port."""

  def __init__(self, workdir: str, extra: Sequence[str]) -> None:
    self.port = _free_port()
    command = [sys.executable, "-m", "t2t_jax.cli.serve", f"--workdir={workdir}"]
    command += [f"--port={self.port}", "--metrics", "--request_timeout=600", *extra]
    self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

  def wait_ready(self, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        raise SystemExit(f"t2t-serve exited: {self.proc.stderr.read().decode()[-2000:]}")
      try:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ready", timeout=5):
          return
      except OSError:
        time.sleep(0.5)
    raise SystemExit("t2t-serve did not become ready")

  def rss_mib(self) -> float:
    with open(f"/proc/{self.proc.pid}/status") as f:
      kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024

  def metric(self, name: str) -> float:
    return metric(self.port, name)

  def stop(self) -> None:
    self.proc.terminate()
    self.proc.wait(120)


def metric(port: int, name: str) -> float:
  """One value of a t2t-serve's /metrics (--metrics)."""
  with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
    text = r.read().decode()
  return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def _one_request(port: int, body: bytes) -> float:
  started = time.perf_counter()
  conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
  try:
    conn.request("POST", "/translate", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    if response.status != 200:
      raise SystemExit(f"t2t-bench: t2t-serve answered {response.status}")
  finally:
    conn.close()
  return time.perf_counter() - started


def load_run(
  port: int, sentences: Sequence[str], clients: int, requests: int, pair: tuple
) -> dict[str, float]:
  """`requests` one-sentence requests from `clients` threads in a closed loop."""
  bodies = [
    json.dumps(dict(q=sentences[i % len(sentences)], source=pair[0], target=pair[1])).encode()
    for i in range(requests)
  ]
  batches, batched = metric(port, "t2t_serve_batches"), metric(port, "t2t_serve_batched_requests")
  started = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    latencies = sorted(pool.map(lambda b: _one_request(port, b), bodies))
  wall = time.perf_counter() - started
  batches = metric(port, "t2t_serve_batches") - batches
  batched = metric(port, "t2t_serve_batched_requests") - batched
  return dict(
    clients=clients,
    requests=requests,
    requests_per_s=requests / wall,
    p50_ms=1000 * statistics.median(latencies),
    p95_ms=1000 * latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
    requests_per_batch=batched / max(batches, 1),
  )


def direct(model: Any, sentences: Sequence[str]) -> dict[str, float]:
  """The model without HTTP: one call per sentence, and all sentences in one call, each
  timed on its second pass (the first compiles every shape it meets)."""
  for _ in range(2):
    started = time.perf_counter()
    for s in sentences:
      model.translate([s])
    one_each = time.perf_counter() - started
  for _ in range(2):
    started = time.perf_counter()
    model.translate(list(sentences))
    all_at_once = time.perf_counter() - started
  return dict(
    one_call_each_per_s=len(sentences) / one_each,
    one_call_each_ms=1000 * one_each / len(sentences),
    all_in_one_call_per_s=len(sentences) / all_at_once,
  )


def measure_serve(
  workdir: str,
  clients: Sequence[int] = (1, 4, 16, 64),
  requests: int = 256,
  checkpoint: str = "auto",
  beam_size: int | None = None,
  input_path: str | None = None,
  repeats: int = 2,
) -> dict[str, Any]:
  """The load table, the batching gain at 16 clients and the direct figures."""
  from t2t_jax.serve import worker

  sentences, where = sentences_for(workdir, max(requests, 64), input_path)
  flags = [f"--checkpoint={checkpoint}"] + ([f"--beam_size={beam_size}"] if beam_size else [])
  settings = worker.ModelSettings((workdir,), checkpoint=checkpoint, beam_size=beam_size)
  model = worker.Model(settings)
  model.load()
  result: dict[str, Any] = dict(workdir=workdir, sentences=where, requests=requests)
  result["direct"] = direct(model, sentences[:requests])
  del model
  pair = _pair(workdir)
  batched = _ServerProcess(workdir, flags)
  single = _ServerProcess(workdir, [*flags, "--max_batch_chars=1"])
  try:
    batched.wait_ready()
    single.wait_ready()
    for server in (batched, single):  # compile the batch shapes the runs will meet
      for c in clients:
        load_run(server.port, sentences, c, min(requests, 8 * c), pair)
    result["rss_mib_before"] = batched.rss_mib()
    result["load"] = [load_run(batched.port, sentences, c, requests, pair) for c in clients]
    result["unbatched"] = [load_run(single.port, sentences, c, requests, pair) for c in clients]
    gains = []
    for _ in range(repeats):
      a = load_run(batched.port, sentences, 16, requests, pair)["requests_per_s"]
      b = load_run(single.port, sentences, 16, requests, pair)["requests_per_s"]
      gains.append(a / b)
    result["batching_gain_16"] = gains
    result["rss_mib_after"] = batched.rss_mib()
    result["requests_total"] = batched.metric("t2t_serve_batched_requests")
  finally:
    batched.stop()
    single.stop()
  return result


def _pair(workdir: str) -> tuple[str, str]:
  from t2t_jax import data
  from t2t_jax.translate import load_config

  config = load_config(workdir).data
  return config.source_lang or "en", data.target_language(config)


def table(r: dict[str, Any]) -> str:
  d = r["direct"]
  lines = [
    f"serve: {r['workdir']} ({r['sentences']}), {r['requests']} one-sentence requests per row",
    f"  direct, one call per sentence  {d['one_call_each_per_s']:8.1f} sentences/s "
    f"({d['one_call_each_ms']:.1f} ms each)",
    f"  direct, all in one call        {d['all_in_one_call_per_s']:8.1f} sentences/s",
    "  clients  batched: req/s   p50 ms   p95 ms  req/batch | unbatched: req/s   p50 ms   p95 ms",
  ]
  for a, b in zip(r["load"], r["unbatched"]):
    lines.append(
      f"  {a['clients']:7d}  {a['requests_per_s']:14.1f} {a['p50_ms']:8.1f} {a['p95_ms']:8.1f} "
      f"{a['requests_per_batch']:10.1f} | {b['requests_per_s']:16.1f} {b['p50_ms']:8.1f} "
      f"{b['p95_ms']:8.1f}"
    )
  gains = ", ".join(f"{g:.2f}x" for g in r["batching_gain_16"])
  lines.append(f"  batching gain at 16 clients (batched / unbatched req/s, alternated): {gains}")
  lines.append(
    f"  server memory: {r['rss_mib_before']:.0f} MiB after warm-up, {r['rss_mib_after']:.0f} "
    f"MiB after {r['requests_total']:.0f} requests"
  )
  return "\n".join(lines)
