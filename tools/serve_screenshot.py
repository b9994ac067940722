"""A screenshot of t2t-serve's page with a translation, its n-best and its attention.

    python tools/serve_screenshot.py --workdir=DIR --text="3 1 4 1 5 9 2 6" \\
        [--alternatives=2] [--out=docs/serving_page.png] [--chromium=/usr/bin/chromium]

Starts `t2t-serve` on the workdir, drives the distribution's Chromium with playwright (as
tests/test_serve_browser.py does), types the text, presses Translate and saves the page.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.request


def _free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _wait_ready(port: int, proc: subprocess.Popen, timeout: float = 600) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise SystemExit(f"t2t-serve exited {proc.returncode}")
    try:
      with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
        if r.status == 200:
          return
    except OSError:
      pass
    time.sleep(0.5)
  raise SystemExit("t2t-serve did not become ready")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--text", required=True)
  parser.add_argument("--alternatives", type=int, default=2)
  parser.add_argument("--out", default="docs/serving_page.png")
  parser.add_argument("--chromium", default=shutil.which("chromium") or "")
  args = parser.parse_args()
  from playwright.sync_api import sync_playwright

  port = _free_port()
  command = [sys.executable, "-m", "t2t_jax.cli.serve", f"--workdir={args.workdir}"]
  proc = subprocess.Popen([*command, f"--port={port}"], env=dict(os.environ))
  try:
    _wait_ready(port, proc)
    with sync_playwright() as p:
      browser = p.chromium.launch(executable_path=args.chromium)
      page = browser.new_page(viewport={"width": 900, "height": 900})
      page.goto(f"http://127.0.0.1:{port}/")
      page.wait_for_selector("#pair:not(:empty)")
      page.fill("#source", args.text)
      page.select_option("#nbest", str(args.alternatives))
      page.click("#translate")
      page.wait_for_selector("#heatmap tbody td")
      page.screenshot(path=args.out, full_page=True)
      browser.close()
  finally:
    proc.terminate()
    proc.wait(60)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
