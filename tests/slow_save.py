"""t2t-train whose checkpoint commit, or test translation, takes `T2T_SLOW_S` seconds, so that
a test's signal lands inside it: `python -m tests.slow_save write|test T2T-TRAIN-FLAGS...`.

`write`: the first file orbax writes into a step's temporary directory (a commit marker)
waits; `test`: the test translation waits before it starts. Each prints a line when the wait
begins and one when it ends, and creates `<T2T_SLOW_DIR>/<mode>` when it begins.
"""

import asyncio
import os
import sys
import time

from orbax.checkpoint._src.path import async_path

from t2t_jax.cli import train as train_cli
from t2t_jax.training import evaluation

DIR = os.environ["T2T_SLOW_DIR"]
SECONDS = float(os.environ.get("T2T_SLOW_S", "10"))


def _begin(mode: str) -> bool:
  marker = os.path.join(DIR, mode)
  if os.path.exists(marker):  # slow once per process
    return False
  print(f"slow {mode}: started", flush=True)
  open(marker, "w").close()
  return True


def slow_write(write_text):
  async def wrapped(path, text, *args, **kwargs):
    if ".orbax-checkpoint-tmp" in str(path) and _begin("write"):
      await asyncio.sleep(SECONDS)
      print("slow write: committing", flush=True)
    return await write_text(path, text, *args, **kwargs)

  return wrapped


def slow_test(translate_test):
  def wrapped(*args, **kwargs):
    if _begin("test"):
      time.sleep(SECONDS)
      print("slow test: translating", flush=True)
    return translate_test(*args, **kwargs)

  return wrapped


if __name__ == "__main__":
  mode = sys.argv.pop(1)
  if mode == "write":
    async_path.write_text = slow_write(async_path.write_text)
  else:
    evaluation.translate_test = slow_test(evaluation.translate_test)
  train_cli.run()
