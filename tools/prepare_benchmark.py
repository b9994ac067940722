"""Prepare once, start in seconds: t2t-prepare and t2t-train on a generated WMT-sized corpus.

    nice -n 5 python tools/prepare_benchmark.py --pairs=5000000,500000 [--in_memory_pairs=500000]
    nice -n 5 python tools/prepare_benchmark.py --pairs=2000000 --dir=/work/bench --keep_data \
        --variant=old=/path/to/old/checkout --variant=new=.
    nice -n 5 python tools/prepare_benchmark.py --pairs=2000000 --data_from=/work/bench/t2t_...

For each corpus size: generates aligned text files of WMT-like pairs (words per sentence
log-normal with mean ~25 and a long tail, Zipf-distributed words from a 50k-word lexicon per
language; dev and test of 3000 pairs), runs `t2t-prepare`, then `t2t-train` twice on the
prepared workdir: fresh (no checkpoint) and on restart (resumes the checkpoint the fresh
run saved), each stopped by SIGTERM once its first training step is logged. Prints the
preparation time, the store size, the peak resident set of each process (ru_maxrss of the
child: mapped store pages it touched included), the peak of its anonymous memory (RssAnon
of /proc/PID/status, sampled every 50 ms: the heap, without mapped files) and the time from
process start to its first training step (the progress line). Each `--variant=NAME=DIR` runs
both t2t-train runs with PYTHONPATH=DIR (another checkout of the package) on the same
prepared data, interleaved (fresh A, fresh B, restart A, restart B); `--data_from` reuses the
prepared data of an earlier run kept with `--keep_data`. `--in_memory_pairs` adds one t2t-train
run that tokenizes into memory at start (config.data.prepared_store=False), as before the
store existed. The model is tiny (d_model 64), so the times are the data's and XLA's.
Nothing is shipped: corpora and workdirs live in a temporary directory under --dir (give
one on disk: the training workdirs hold the bucket plan's scratch files, and /tmp may be
RAM-backed) and are removed after each size unless --keep_data (the tools' logs are kept).
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

LEXICON = 50_000
STOPPED_EXIT = 75  # t2t-train's status after a SIGTERM that saved a checkpoint
EXPERIMENT = """
from t2t_jax.experiments import tiny


def get_config():
  config = tiny.get_config()
  config.data.update(
      source='textfiles', train_source={train_en!r}, train_target={train_de!r},
      dev_source={dev_en!r}, dev_target={dev_de!r}, test_source={test_en!r},
      test_target={test_de!r}, vocab_size={vocab_size}, vocab_max_sentences={vocab_sentences},
      max_len=256, pack_len=256, bucket_boundaries=(), tokens_per_batch=4096)
  config.model.update(max_len=512)
  config.update(num_train_steps=100000, log_every_steps=1, eval_every_steps=100000,
                checkpoint_every_steps=1, test_at_end=False, select_checkpoints='')
  return config
"""


def _lexicon(rng, size: int, alphabet: str) -> list[str]:
  lengths = np.clip(rng.poisson(6, size), 1, 18)
  letters = rng.integers(0, len(alphabet), int(lengths.sum()))
  chars = np.array(list(alphabet))[letters]
  ends = np.cumsum(lengths)
  return ["".join(chars[e - n : e]) for e, n in zip(ends, lengths)]


def write_corpus(
  directory: str, stem: str, pairs: int, seed: int, max_words: int = 250, chunk: int = 100_000
) -> None:
  """`pairs` aligned lines in <stem>.en / <stem>.de: ~25 words on average, long tail."""
  rng = np.random.default_rng(seed)
  en_words = _lexicon(np.random.default_rng(1), LEXICON, "abcdefghijklmnopqrstuvwxyz")
  de_words = _lexicon(np.random.default_rng(2), LEXICON, "abcdefghijklmnopqrstuvwxyzäöüß")
  with (
    open(os.path.join(directory, f"{stem}.en"), "w", encoding="utf-8") as en,
    open(os.path.join(directory, f"{stem}.de"), "w", encoding="utf-8") as de,
  ):
    for start in range(0, pairs, chunk):
      n = min(chunk, pairs - start)
      src_len = np.clip(np.rint(rng.lognormal(np.log(22), 0.55, n)), 1, max_words).astype(int)
      tgt_len = np.clip(np.rint(src_len * rng.uniform(0.85, 1.25, n)), 1, max_words).astype(int)
      for lengths, words, out in ((src_len, en_words, en), (tgt_len, de_words, de)):
        ids = (np.minimum(rng.zipf(1.15, int(lengths.sum())), LEXICON) - 1).tolist()
        flat = [words[i] for i in ids]
        ends = np.cumsum(lengths).tolist()
        out.write("".join(" ".join(flat[e - k : e]) + "\n" for e, k in zip(ends, lengths.tolist())))


class Child:
  """A tool run as a child process: wall time to a log line, peak RSS from wait4."""

  STEP = re.compile(r"\] step (\d+)/(\d+) \(")

  def __init__(self, args: list[str], log_path: str, pythonpath: str = ""):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    if pythonpath:
      env["PYTHONPATH"] = os.path.abspath(pythonpath)
    self.start = time.perf_counter()
    self.first_step_s = None
    self.data_setup_s = None  # the data report's 'setup:' stages, summed
    self.data_ready_s = None  # process start -> the data report (imports included)
    self._log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed by wait())
    self.proc = subprocess.Popen(
      args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    self._reader = threading.Thread(target=self._read)
    self._reader.start()
    self.peak_anon_kib = 0
    self._sampler = threading.Thread(target=self._sample_anon, daemon=True)
    self._sampler.start()

  def _sample_anon(self, every_s: float = 0.05) -> None:
    """Keeps the maximum of the child's RssAnon (kB) until it exits."""
    path = f"/proc/{self.proc.pid}/status"
    while self.proc.returncode is None:
      try:
        with open(path, encoding="ascii") as f:
          found = re.search(r"^RssAnon:\s+(\d+) kB", f.read(), re.M)
      except OSError:  # gone (or a zombie being reaped)
        return
      if found:
        self.peak_anon_kib = max(self.peak_anon_kib, int(found.group(1)))
      time.sleep(every_s)

  def _read(self) -> None:
    for line in self.proc.stdout:
      self._log.write(line)
      if self.data_ready_s is None and "] Data:" in line:
        self.data_ready_s = time.perf_counter() - self.start
      if line.startswith("setup: "):
        self.data_setup_s = sum(float(x) for x in re.findall(r" ([\d.]+)s\b", line))
      if self.first_step_s is None and self.STEP.search(line):
        self.first_step_s = time.perf_counter() - self.start
        self.proc.send_signal(signal.SIGTERM)  # saves a checkpoint at the next step, exits

  def wait(self) -> dict:
    _, status, usage = os.wait4(self.proc.pid, 0)
    wall = time.perf_counter() - self.start
    self._reader.join()
    self._log.close()
    self.proc.returncode = os.waitstatus_to_exitcode(status)
    self._sampler.join()
    if self.proc.returncode not in (0, STOPPED_EXIT):
      sys.exit(f"{self.proc.args[0]} failed (exit {self.proc.returncode}); see {self._log.name}")
    return dict(
      wall_s=round(wall, 1),
      peak_rss_mib=round(usage.ru_maxrss / 1024, 1),
      peak_anon_mib=round(self.peak_anon_kib / 1024, 1),
      data_setup_s=self.data_setup_s,
      data_ready_s=None if self.data_ready_s is None else round(self.data_ready_s, 1),
      first_step_s=None if self.first_step_s is None else round(self.first_step_s, 1),
    )


def _tool(name: str) -> str:
  return os.path.join(os.path.dirname(sys.executable), name)


def _generate(corpus: str, pairs: int) -> float:
  os.makedirs(corpus)
  t0 = time.perf_counter()
  write_corpus(corpus, "train", pairs, seed=0)
  write_corpus(corpus, "dev", 3000, seed=1, max_words=60)
  write_corpus(corpus, "test", 3000, seed=2, max_words=60)
  return time.perf_counter() - t0


def _store_figures(data_dir: str) -> dict:
  store = os.path.join(data_dir, "prepared")
  with open(os.path.join(store, "manifest.json"), encoding="utf-8") as f:
    manifest = json.load(f)
  return dict(
    store_mib=round(
      sum(os.path.getsize(os.path.join(store, f)) for f in os.listdir(store)) / 2**20, 1
    ),
    manifest_seconds=manifest["seconds"],
    train_counts=manifest["splits"]["train"],
  )


def run_size(root: str, pairs: int, args) -> dict:
  source_root = args.data_from or root
  corpus = os.path.join(source_root, f"corpus{pairs}")
  data_dir = os.path.join(source_root, f"data{pairs}")  # vocabulary and prepared store
  result = dict(pairs=pairs)
  if not args.data_from:
    result["generate_s"] = round(_generate(corpus, pairs), 1)
  paths = {
    f"{split}_{lang}": os.path.join(corpus, f"{split}.{lang}")
    for split in ("train", "dev", "test")
    for lang in ("en", "de")
  }
  result["corpus_mib"] = round(sum(os.path.getsize(p) for p in paths.values()) / 2**20, 1)
  experiment = os.path.join(root, f"bench{pairs}.py")
  with open(experiment, "w", encoding="utf-8") as f:
    f.write(
      EXPERIMENT.format(vocab_size=args.vocab_size, vocab_sentences=args.vocab_sentences, **paths)
    )

  def common(name: str) -> list[str]:
    workdir = os.path.join(root, f"{name}{pairs}")
    return [
      f"--experiment={experiment}",
      f"--workdir={workdir}",
      f"--config.data.data_dir={data_dir}",
    ]

  if not args.data_from:
    result["prepare"] = Child(
      [_tool("t2t-prepare"), *common("prepare")], os.path.join(root, f"prepare{pairs}.log")
    ).wait()
  result.update(_store_figures(data_dir))
  variants = dict(v.split("=", 1) for v in args.variant) or {"": ""}
  for run in ("fresh", "restart"):  # interleaved: fresh A, fresh B, restart A, restart B
    for name, pythonpath in variants.items():
      key = f"train_{run}" + (f"_{name}" if name else "")
      workdir = f"train_{name}" if name else "train"
      result[key] = Child(
        [_tool("t2t-train"), *common(workdir)], os.path.join(root, f"{key}{pairs}.log"), pythonpath
      ).wait()
  if pairs == args.in_memory_pairs:
    result["train_in_memory"] = Child(
      [
        _tool("t2t-train"),
        f"--experiment={experiment}",
        f"--workdir={os.path.join(root, f'memory{pairs}')}",
        "--config.data.prepared_store=False",
      ],
      os.path.join(root, f"memory{pairs}.log"),
    ).wait()
  for name in (*(f"train_{n}" if n else "train" for n in variants), "prepare", "memory"):
    shutil.rmtree(os.path.join(root, f"{name}{pairs}"), ignore_errors=True)
  if not (args.keep_data or args.data_from):
    for path in (corpus, data_dir):
      shutil.rmtree(path, ignore_errors=True)
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--pairs", default="5000000,500000", help="corpus sizes, comma-separated")
  parser.add_argument(
    "--in_memory_pairs",
    type=int,
    default=0,
    help="at this size, also time t2t-train with prepared_store=False",
  )
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument(
    "--vocab_sentences", type=int, default=200_000, help="config.data.vocab_max_sentences"
  )
  parser.add_argument("--dir", default="", help="where to work (default: a temporary dir)")
  parser.add_argument(
    "--variant",
    action="append",
    default=[],
    help="NAME=DIR: run t2t-train with PYTHONPATH=DIR (repeat to compare checkouts)",
  )
  parser.add_argument(
    "--keep_data", action="store_true", help="keep the corpora and prepared stores"
  )
  parser.add_argument(
    "--data_from", default="", help="reuse the corpora and stores kept in this earlier --dir run"
  )
  args = parser.parse_args()
  root = tempfile.mkdtemp(prefix="t2t_prepare_bench_", dir=args.dir or None)
  print(f"working in {root}", flush=True)
  for pairs in (int(p) for p in args.pairs.split(",")):
    print(json.dumps(run_size(root, pairs, args)), flush=True)
  print(f"logs in {root}", flush=True)


if __name__ == "__main__":
  main()
