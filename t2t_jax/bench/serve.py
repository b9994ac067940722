"""t2t-bench --parts=serve: t2t-serve under load against calling the Translator directly.

    t2t-bench --parts=serve --workdir=DIR [--serve_clients=1,4,16,64] [--serve_requests=256]
        [--serve_pairs=2] [--serve_memory_requests=10000]

Starts two `t2t-serve` processes on the workdir, one batching concurrent requests (the
default window) and one with batching off (--max_batch_chars=1: every batch is one
request), and sends one-sentence LibreTranslate requests from 1, 4, 16 and 64 concurrent
clients (threads, one connection per request) in a closed loop: requests/s and p50/p95/p99
latency per client count. With --serve_pairs=2 each server serves the workdir under two
pair names (its own pair and the reverse: two models, two batching threads) and the
requests alternate between them. The load figure is the batched server's requests/s at 16
clients against 1. The batching gain is the ratio of the two servers' requests/s at 16
clients, measured alternately (A, B, A, B) so that other load on the machine falls on
both. Direct: the same model (serve.worker.Model) translating the sentences one call each,
and all in one call, without HTTP. The batched server's resident memory after its first
100 requests, after the warm-up, and after --serve_memory_requests requests in all (the
rest sent from 16 clients, a row of its own) shows whether thousands of requests make it
grow; the figures are printed, nothing is asserted.
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
from collections.abc import Callable, Sequence
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


FIRST_REQUESTS = 100  # the memory baseline: the server's resident memory after this many
MEMORY_CLIENTS = 16  # the clients that send the requests up to --serve_memory_requests
RATIO_CLIENTS = (16, 1)  # the load figure: requests/s at 16 clients against 1


def rss_mib(pid: int) -> float:
  """A process's resident memory (VmRSS), MiB."""
  with open(f"/proc/{pid}/status") as f:
    kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
  return kib / 1024


class ServerProcess:
  """A t2t-serve child process on a free port; `entries` are its --workdir values."""

  def __init__(self, entries: Sequence[str], extra: Sequence[str]) -> None:
    self.port = _free_port()
    command = [sys.executable, "-m", "t2t_jax.cli.serve"]
    command += [f"--workdir={entry}" for entry in entries]
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
    return rss_mib(self.proc.pid)

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


def nearest_rank(ordered: Sequence[float], q: float) -> float:
  """The q-quantile of sorted values by the nearest rank above (the largest for q near 1)."""
  return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load_run(
  port: int,
  sentences: Sequence[str],
  clients: int,
  requests: int,
  pair: tuple | None = None,
  pairs: Sequence[tuple] | None = None,
) -> dict[str, float]:
  """`requests` one-sentence requests from `clients` threads in a closed loop; with `pairs`
  request i asks for pairs[i % len(pairs)] (source, target), else every one for `pair`."""
  pairs = list(pairs or [pair])
  bodies = []
  for i in range(requests):
    source, target = pairs[i % len(pairs)]
    q = sentences[i % len(sentences)]
    bodies.append(json.dumps(dict(q=q, source=source, target=target)).encode())
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
    p95_ms=1000 * nearest_rank(latencies, 0.95),
    p99_ms=1000 * nearest_rank(latencies, 0.99),
    requests_per_batch=batched / max(batches, 1),
  )


def throughput_ratio(rows: Sequence[dict[str, float]]) -> float | None:
  """Requests/s at 16 clients over requests/s at 1 (None unless both were measured)."""
  rate = {row["clients"]: row["requests_per_s"] for row in rows}
  many, one = RATIO_CLIENTS
  return rate[many] / rate[one] if many in rate and one in rate else None


def load_over_pairs(
  port: int,
  sentences: Sequence[str],
  pairs: Sequence[tuple],
  clients: Sequence[int],
  requests: int,
  rss: Callable[[], float],
  memory_requests: int,
  first: int = FIRST_REQUESTS,
) -> dict[str, Any]:
  """A fresh server (`port`, --metrics) under load, its requests alternating between
  `pairs`: its memory (`rss()`, MiB) after its first `first` requests (from 16 clients),
  after the warm-up (every batch shape the rows meet), the rows, the 16-against-1 ratio,
  then its memory after `memory_requests` requests in all, the rest from 16 clients (the
  `sustained` row; none when the count is already reached)."""

  def served() -> int:
    return int(metric(port, "t2t_serve_batched_requests"))

  load_run(port, sentences, MEMORY_CLIENTS, first, pairs=pairs)
  out: dict[str, Any] = dict(pairs=[f"{s}-{t}" for s, t in pairs])
  out.update(rss_mib_first=rss(), requests_first=served())
  for c in clients:  # compile the batch shapes the runs will meet
    load_run(port, sentences, c, min(requests, 8 * c), pairs=pairs)
  out.update(rss_mib_before=rss(), requests_before=served())
  out["load"] = [load_run(port, sentences, c, requests, pairs=pairs) for c in clients]
  out["load_ratio_16_to_1"] = throughput_ratio(out["load"])
  rest = memory_requests - served()
  out["sustained"] = (
    load_run(port, sentences, MEMORY_CLIENTS, rest, pairs=pairs) if rest > 0 else None
  )
  out.update(rss_mib_many=rss(), requests_many=served())
  return out


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
  pairs: int = 1,
  memory_requests: int = 10000,
) -> dict[str, Any]:
  """The load table over `pairs` pair names of the workdir, the 16-against-1 ratio, the
  batching gain at 16 clients, the memory figures and the direct figures."""
  from t2t_jax.serve import worker

  sentences, where = sentences_for(workdir, max(requests, 64), input_path)
  flags = [f"--checkpoint={checkpoint}"] + ([f"--beam_size={beam_size}"] if beam_size else [])
  settings = worker.ModelSettings((workdir,), checkpoint=checkpoint, beam_size=beam_size)
  model = worker.Model(settings)
  model.load()
  result: dict[str, Any] = dict(workdir=workdir, sentences=where, requests=requests)
  result["direct"] = direct(model, sentences[:requests])
  del model
  served = pair_names(workdir, pairs)
  # One pair: the workdir under its own name, as a user starts it; two: each pair named.
  entries = [workdir] if pairs == 1 else [f"{s}:{t}={workdir}" for s, t in served]
  batched = ServerProcess(entries, flags)
  single = ServerProcess(entries, [*flags, "--max_batch_chars=1"])
  try:
    batched.wait_ready()
    single.wait_ready()
    result.update(
      load_over_pairs(
        batched.port, sentences, served, clients, requests, batched.rss_mib, memory_requests
      )
    )
    for c in clients:  # compile the batch shapes the runs will meet
      load_run(single.port, sentences, c, min(requests, 8 * c), pairs=served)
    result["unbatched"] = [
      load_run(single.port, sentences, c, requests, pairs=served) for c in clients
    ]
    gains = []
    for _ in range(repeats):
      a = load_run(batched.port, sentences, 16, requests, pairs=served)["requests_per_s"]
      b = load_run(single.port, sentences, 16, requests, pairs=served)["requests_per_s"]
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


PAIRS = (1, 2)  # --serve_pairs: the workdir's own pair, and also its reverse


def pair_names(workdir: str, n: int) -> list[tuple[str, str]]:
  """The pairs the servers give the workdir: its own, then (n=2) the reverse, a second
  model of the same parameters with its own batching thread."""
  if n not in PAIRS:
    raise ValueError(f"{n} pairs: {' or '.join(map(str, PAIRS))}")
  source, target = _pair(workdir)
  if n == 2 and source == target:
    raise ValueError(f"the workdir translates {source} to {target}: no second pair name")
  return [(source, target), (target, source)][:n]


def table(r: dict[str, Any]) -> str:
  d = r["direct"]
  pairs = r["pairs"]
  over = f", alternating between {len(pairs)} pairs ({', '.join(pairs)})" if len(pairs) > 1 else ""
  lines = [
    f"serve: {r['workdir']} ({r['sentences']}), {r['requests']} one-sentence requests per row"
    + over,
    f"  direct, one call per sentence  {d['one_call_each_per_s']:8.1f} sentences/s "
    f"({d['one_call_each_ms']:.1f} ms each)",
    f"  direct, all in one call        {d['all_in_one_call_per_s']:8.1f} sentences/s",
    "  clients  batched: req/s   p50 ms   p95 ms   p99 ms  req/batch | unbatched: req/s   "
    "p50 ms   p95 ms   p99 ms",
  ]
  for a, b in zip(r["load"], r["unbatched"]):
    lines.append(
      f"  {a['clients']:7d}  {a['requests_per_s']:14.1f} {_latencies(a)} "
      f"{a['requests_per_batch']:10.1f} | {b['requests_per_s']:16.1f} {_latencies(b)}"
    )
  ratio = r["load_ratio_16_to_1"]
  lines.append(
    "  load: batched req/s at 16 clients / at 1 client: "
    + (f"{ratio:.2f}x" if ratio is not None else "(needs 1 and 16 in --serve_clients)")
  )
  gains = ", ".join(f"{g:.2f}x" for g in r["batching_gain_16"])
  lines.append(f"  batching gain at 16 clients (batched / unbatched req/s, alternated): {gains}")
  s = r["sustained"]
  if s is not None:
    lines.append(
      f"  sustained, {s['clients']} clients, {s['requests']} requests: "
      f"{s['requests_per_s']:.1f} req/s, p50/p95/p99 {s['p50_ms']:.1f} / {s['p95_ms']:.1f} / "
      f"{s['p99_ms']:.1f} ms, {s['requests_per_batch']:.1f} req/batch"
    )
  lines.append(
    f"  server memory (batched): {r['rss_mib_first']:.0f} MiB after the first "
    f"{r['requests_first']} requests, {r['rss_mib_before']:.0f} MiB after warm-up "
    f"({r['requests_before']}), {r['rss_mib_many']:.0f} MiB after {r['requests_many']}, "
    f"{r['rss_mib_after']:.0f} MiB after all {r['requests_total']:.0f}"
  )
  return "\n".join(lines)


def _latencies(row: dict[str, float]) -> str:
  return f"{row['p50_ms']:8.1f} {row['p95_ms']:8.1f} {row['p99_ms']:8.1f}"
