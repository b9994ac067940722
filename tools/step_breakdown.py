"""Where a staged search's steps go: translates a file as `Translator.translate` does,
records when each row of each batch was done (the stopping rule's own end) and how long
its best output is, then replays the batches through `stages.run_in_stages` on a stand-in
search whose rows end at those steps, and prints the row-steps run, split by why:

    python tools/step_breakdown.py WORKDIR INPUT [--beam=4] [--dtype=float32] \
        [--checkpoint=latest] [--beam_stop=exact] [--json=OUT]
    python tools/step_breakdown.py --batches=OUT [--min_rows=N] [--compacted_bound=N] \
        [--halves_from=N | --every_size]

- `needed`: each sentence's best output, EOS included (`DecodeStats.needed_row_steps`);
- `rule`: the steps a sentence runs after its output's EOS until the stopping rule is
  sure that no live hypothesis can beat it (beam search's exact rule: under the length
  penalty of the sentence's limit) or until its limit (`at_limit` sentences);
- `waiting`: done sentences stepped beside running ones until their batch is compacted
  (`waiting_below_min_rows`: in a batch of the smallest size, never compacted);
- `padding`: the rows that round a batch up to a power of two (done after one step);
- `filler`: the done rows that round a compacted batch up to its size.

`needed` + `rule` is what any schedule of the same search runs at least (`floor`, as a
ratio `floor_over_needed`): a row that stepped only until it was done. `stage_programs`
counts the distinct stage programs the replay calls (as `programs.warm_up_stages` counts
them: each size and cache bound, takes and resizes, the full batches' by source length).

The recording pass runs each batch at its full size, a stage ending whenever a row is done
(the outputs are frozen from then on, so they are translate()'s: checked against a plain
pass); its replay under the search's own schedule gives the row-steps `Translator.stats`
counts (`measured_row_steps`). --json writes the recorded batches; --batches replays them
under schedules to weigh, which the search does not have: another min_rows or
compacted_bound; --halves_from=N, batches of N rows or more also taking the sizes halfway
between powers of two (3 x 2^k: 96, 192, ...), so compacted once a quarter (a third) of
their rows are done; --every_size, a batch compacted into exactly its running rows whenever
one is done (with --min_rows=1, `waiting` and `filler` are then 0).
"""

import argparse
import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from t2t_jax.decoding import stages as stages_lib

CATEGORIES = ("needed", "rule", "waiting", "waiting_below_min_rows", "padding", "filler")
SENTENCE, PADDING, FILLER = 0, 1, 2  # what a replayed row is


@dataclasses.dataclass
class Batch:
  """One recorded batch: its cache's bounds and the staged search's settings, and per row
  its end step, its best output's length (0: padding), whether it is a sentence and its
  output limit; source_len: its padded source length."""

  bounds: list[int]
  min_rows: int
  compacted_bound: int
  ends: list[int]
  needed: list[int]
  real: list[bool]
  limits: list[int]
  source_len: int


def record(translator: Any, lines: list[str], search: Any) -> tuple[list[str], list[Batch]]:
  """translate()'s outputs of `lines` under `search`, and its batches in the order their
  searches ended."""
  import jax

  from t2t_jax.decoding import programs
  from t2t_jax.tokens import PAD_ID

  batches = []
  original = programs.run_in_stages

  def traced(stages, rows, batch_size, bounds, min_rows=1, stats=None, compacted_bound=0):
    ends = np.full(batch_size, -1)
    not_done = [batch_size]

    def each_end(fn: Callable) -> Callable:
      def call(x: Any, bound: int, until: int) -> tuple:
        out = fn(x, bound, max(not_done[0] - 1, 0))  # ends once one more row is done
        step, done = jax.device_get((out[1], out[2]))
        ends[(ends < 0) & done] = int(step)
        not_done[0] = int(np.sum(~done))
        return out

      return call

    fine = stages._replace(run=each_end(stages.run), first=each_end(stages.first or stages.run))
    # min_rows = batch_size: never compacted
    outputs = original(fine, rows, batch_size, bounds, batch_size, stats, compacted_bound)
    ends[ends < 0] = bounds[-1]
    inputs, limits = jax.device_get((rows.inputs, rows.limits))
    real = np.asarray(inputs).any(axis=1)
    needed = np.where(real, np.sum(outputs[0][:, 0] != PAD_ID, axis=-1), 0)
    limits = np.minimum(limits, bounds[-1])
    batch = Batch(
      list(bounds), min_rows, compacted_bound, ends.tolist(), needed.tolist(), real.tolist(),
      limits.tolist(), int(inputs.shape[1]),
    )  # fmt: skip
    batches.append(batch)
    return outputs

  programs.run_in_stages = traced
  try:
    texts = translator.translate(lines, search=search)
  finally:
    programs.run_in_stages = original
  return texts, batches


def replay(
  batch: Batch, programs: set | None = None, memory_len: int | None = None, **settings: Any
) -> dict[str, int]:
  """What `stages.run_in_stages` runs on `batch`'s ends, with the batch's min_rows and
  compacted_bound unless `settings` replace them: row-steps by category (`CATEGORIES`),
  stages and compactions. `programs` is added the stage programs it calls, each keyed by
  the source positions it attends over: the full batch's own, a compacted batch's
  memory_len (`programs.decode_in_stages`; None: the batch's own)."""
  settings = dict(dict(min_rows=batch.min_rows, compacted_bound=batch.compacted_bound), **settings)
  count = dict.fromkeys(CATEGORIES, 0)
  ends, real = np.asarray(batch.ends), np.asarray(batch.real)
  count["needed"] = int(np.sum(batch.needed))
  count["rule"] = int(np.sum(ends[real])) - count["needed"]
  programs = set() if programs is None else programs
  full = len(ends)
  memory = lambda size: batch.source_len if size == full or memory_len is None else memory_len

  def run(rows: dict, bound: int, until: int) -> tuple:
    size, step, start = len(rows["end"]), rows["step"], rows["step"]
    programs.add(("run", size, bound, memory(size)))
    while step < bound and np.sum(rows["end"] > step) > until:
      step += 1
    end, kind = rows["end"], rows["kind"]
    sentences = kind == SENTENCE
    waited = int(np.sum(step - np.clip(end[sentences], start, step)))
    count["waiting_below_min_rows" if size <= settings["min_rows"] else "waiting"] += waited
    count["padding"] += int(np.sum(kind == PADDING)) * (step - start)
    count["filler"] += int(np.sum(kind == FILLER)) * (step - start)
    return dict(rows, step=step), step, end <= step, (end,)

  def take(rows: dict, keep: Any, length: int | None) -> dict:
    size, keep = len(rows["end"]), np.asarray(keep)
    programs.add(("take", size, len(keep), rows["bound"], length, memory(size)))
    end, kind = rows["end"][keep], rows["kind"][keep]
    kind = np.where(end <= rows["step"], FILLER, kind)  # done rows taken to fill the size
    return dict(rows, end=end, kind=kind, bound=length or rows["bound"])

  def resize(rows: dict, length: int) -> dict:
    size = len(rows["end"])
    programs.add(("resize", size, rows["bound"], length, memory(size)))
    return dict(rows, bound=length)

  rows = dict(step=0, end=ends, kind=np.where(real, SENTENCE, PADDING), bound=batch.bounds[0])
  stats = stages_lib.StageStats()
  stages = stages_lib.Stages(run, take, resize)
  stages_lib.run_in_stages(stages, rows, full, batch.bounds, stats=stats, **settings)
  assert sum(count.values()) == stats.row_steps, (count, stats)
  return dict(count, row_steps=stats.row_steps, stages=stats.stages, compactions=stats.compactions)


def summed(batches: list[Batch], **settings: Any) -> dict[str, Any]:
  """`replay` of every batch (compacted batches attending over the longest source, as
  translate()'s do), summed, with the distinct stage programs, the floor and the ratios."""
  total: dict[str, Any] = dict.fromkeys(CATEGORIES, 0)
  programs: set = set()
  memory_len = max(batch.source_len for batch in batches)
  for batch in batches:
    for key, value in replay(batch, programs, memory_len, **settings).items():
      total[key] = total.get(key, 0) + value
  needed = total["needed"]
  total["floor"] = needed + total["rule"]
  total["at_limit"] = sum(
    int(np.sum((np.asarray(b.ends) >= np.asarray(b.limits)) & b.real)) for b in batches
  )
  total["stage_programs"] = len(programs)
  total["run_over_needed"] = round(total["row_steps"] / needed, 4) if needed else None
  total["floor_over_needed"] = round(total["floor"] / needed, 4) if needed else None
  total["run_over_floor"] = round(total["row_steps"] / total["floor"], 4)
  return total


@contextlib.contextmanager
def _sizes(compacted_size: Callable, until_of: Callable) -> Iterator[None]:
  """`stages.run_in_stages` (its `Schedule`) compacting by these functions (`stages.`'s
  signatures) while the context lasts."""
  sizes, untils = stages_lib.compacted_size, stages_lib.until_of
  stages_lib.compacted_size, stages_lib.until_of = compacted_size, until_of
  try:
    yield
  finally:
    stages_lib.compacted_size, stages_lib.until_of = sizes, untils


def every_size() -> contextlib.AbstractContextManager:
  """A schedule that compacts whenever a row is done, into exactly the running rows (at
  least min_rows; --every_size): what done rows cost at the least, in as many programs."""
  return _sizes(
    lambda running, min_rows: max(running, min_rows),
    lambda size, min_rows: size - 1 if size > min_rows else 0,
  )


def halves_from(start: int) -> contextlib.AbstractContextManager:
  """A schedule that also takes, from `start` rows up, the sizes halfway between powers of
  two (--halves_from)."""
  power = stages_lib.power_of_two_at_least
  between = lambda size: size >= start and size % 3 == 0 and power(size // 3) == size // 3

  def compacted_size(running: int, min_rows: int) -> int:
    size = power(running)
    if running <= size * 3 // 4 and between(size * 3 // 4):
      size = size * 3 // 4
    return max(size, min_rows)

  def until_of(size: int, min_rows: int) -> int:
    below = power(size) // 2
    if below * 3 // 2 < size and between(below * 3 // 2):
      below = below * 3 // 2
    return max(below, min_rows) if size > min_rows else 0

  return _sizes(compacted_size, until_of)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("workdir", nargs="?")
  parser.add_argument("input", nargs="?")
  parser.add_argument("--beam", type=int, default=4, help="beam size (1: greedy)")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--checkpoint", default="latest")
  parser.add_argument("--beam_stop", default="", help="exact or heuristic (default: the config's)")
  parser.add_argument("--json", default="", help="write the report and the recorded batches")
  parser.add_argument("--batches", default="", help="replay a --json file's batches instead")
  parser.add_argument("--min_rows", type=int, default=None)
  parser.add_argument("--compacted_bound", type=int, default=None)
  parser.add_argument("--halves_from", type=int, default=0)
  parser.add_argument("--every_size", action="store_true")
  args = parser.parse_args()
  if bool(args.batches) == bool(args.workdir and args.input):
    parser.error("give WORKDIR and INPUT, or --batches")
  report: dict[str, Any] = {}
  if args.batches:
    with open(args.batches, encoding="utf-8") as f:
      batches = [Batch(**b) for b in json.load(f)["batches"]]
  else:
    os.environ.setdefault("T2T_COMPILATION_CACHE", "off")
    from t2t_jax.decoding.translator import Translator

    with open(args.input, encoding="utf-8") as f:
      lines = [line.rstrip("\n") for line in f]
    tr = Translator.from_workdir(args.workdir, args.checkpoint, args.dtype, batch_threads=1)
    search = tr.search.override(beam_size=args.beam)
    if args.beam_stop:
      search = search.override(beam_stop=args.beam_stop)
    texts, batches = record(tr, lines, search)
    tr.reset_stats()
    if tr.translate(lines, search=search) != texts:
      raise SystemExit("the recording pass gave other outputs than translate()")
    report["measured_row_steps"] = tr.stats.row_steps
  settings = {
    name: value
    for name in ("min_rows", "compacted_bound")
    if (value := getattr(args, name)) is not None
  }
  sizes = contextlib.nullcontext()
  if args.every_size:
    sizes = every_size()
  elif args.halves_from:
    sizes = halves_from(args.halves_from)
  with sizes:
    report.update(summed(batches, **settings))
  report["batch_rows"] = [len(b.ends) for b in batches]
  print(json.dumps(report, indent=1))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(dict(report, batches=[dataclasses.asdict(b) for b in batches]), f)


if __name__ == "__main__":
  main()
