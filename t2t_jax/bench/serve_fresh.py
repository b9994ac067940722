"""t2t-bench --parts=serve --serve_fresh: t2t-serve as a user first meets it.

    t2t-bench --parts=serve --serve_fresh --workdir=DIR [--serve_clients=1,4,16,64]
        [--serve_requests=256] [--decode_input=FILE]

For each client count a new `t2t-serve` process with the default flags and an empty
compilation cache of its own: the seconds from its start to /ready, then --serve_requests
one-sentence requests from that many concurrent clients (threads, one connection per
request, a closed loop) from /ready on, with nothing sent before: requests/s,
p50/p95/p99 latency and the XLA compilations the server ran after /ready (requests that
waited for a program: `t2t_serve_compilations_after_ready` of its /metrics). The load
figure is requests/s at 16 clients against 1, and the tail p95 / p50 at 16 clients. The
figures are printed; nothing is asserted.
"""

import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from t2t_jax.bench import serve


def fresh_row(
  entries: Sequence[str],
  flags: Sequence[str],
  sentences: Sequence[str],
  clients: int,
  requests: int,
  pair: tuple[str, str],
) -> dict[str, Any]:
  """One fresh server (an empty compilation cache of its own) under `clients` clients."""
  cache = tempfile.mkdtemp(prefix="t2t-serve-fresh-")
  try:
    started = time.perf_counter()
    server = serve.ServerProcess(entries, [*flags, f"--compilation_cache={cache}"])
    try:
      server.wait_ready()
      ready_s = time.perf_counter() - started
      at_ready = server.metric("t2t_serve_compilations")
      row = serve.load_run(server.port, sentences, clients, requests, pair=pair)
      row.update(
        ready_s=ready_s,
        compilations_at_ready=at_ready,
        compilations_after_ready=server.metric("t2t_serve_compilations_after_ready"),
        rss_mib=server.rss_mib(),
      )
      return row
    finally:
      server.stop()
  finally:
    shutil.rmtree(cache, ignore_errors=True)


def measure_fresh(
  workdir: str,
  clients: Sequence[int] = (1, 4, 16, 64),
  requests: int = 256,
  checkpoint: str = "auto",
  input_path: str | None = None,
  extra_flags: Sequence[str] = (),
) -> dict[str, Any]:
  """The fresh-server rows, the 16-against-1 ratio and the 16-client tail ratio."""
  sentences, where = serve.sentences_for(workdir, max(requests, 64), input_path)
  flags = [f"--checkpoint={checkpoint}", *extra_flags]
  pair = serve.pair_names(workdir, 1)[0]
  rows = [fresh_row([workdir], flags, sentences, c, requests, pair) for c in clients]
  by_clients = {row["clients"]: row for row in rows}
  many = by_clients.get(serve.RATIO_CLIENTS[0])
  return dict(
    workdir=workdir,
    sentences=where,
    requests=requests,
    flags=flags,
    fresh=rows,
    load_ratio_16_to_1=serve.throughput_ratio(rows),
    tail_ratio_16=many["p95_ms"] / many["p50_ms"] if many else None,
  )


def table(r: dict[str, Any]) -> str:
  lines = [
    f"serve, fresh servers: {r['workdir']} ({r['sentences']}), {r['requests']} one-sentence "
    f"requests per row from /ready on, each row a new process with an empty compilation cache"
    + (f" ({' '.join(r['flags'])})" if r["flags"] else ""),
    "  clients  ready s    req/s   p50 ms   p95 ms   p99 ms  req/batch  compiled at ready  "
    "after ready  RSS MiB",
  ]
  for row in r["fresh"]:
    lines.append(
      f"  {row['clients']:7d} {row['ready_s']:8.1f} {row['requests_per_s']:8.1f} "
      f"{row['p50_ms']:8.1f} {row['p95_ms']:8.1f} {row['p99_ms']:8.1f} "
      f"{row['requests_per_batch']:10.1f} {row['compilations_at_ready']:18.0f} "
      f"{row['compilations_after_ready']:12.0f} {row['rss_mib']:8.0f}"
    )
  ratio, tail = r["load_ratio_16_to_1"], r["tail_ratio_16"]
  lines.append(
    "  load: req/s at 16 clients / at 1 client: "
    + (f"{ratio:.2f}x" if ratio is not None else "(needs 1 and 16 in --serve_clients)")
    + (f"; p95 / p50 at 16 clients: {tail:.2f}x" if tail is not None else "")
  )
  return "\n".join(lines)
