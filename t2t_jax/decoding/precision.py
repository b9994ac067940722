"""The compute dtype of decoding: float32, or bfloat16 products with float32 accumulation and
float32 logits (TransformerConfig.dtype; parameters stay float32), chosen where the CPU
multiplies bfloat16 in hardware.

XLA:CPU's bfloat16 kernels run a product with float32 accumulation on AMX tiles (Intel
Sapphire Rapids and later, `amx_bf16` in /proc/cpuinfo's flags) or with AVX512-BF16's dot
instructions (`avx512_bf16`: AMD Zen 4 and later, Intel Cooper Lake): about twice the speed
of float32. Elsewhere bfloat16 on a CPU is converted to float32 and slower than float32.
docs/performance.md has the speed and BLEU of each.
"""

import os

DTYPES = ("auto", "float32", "bfloat16")
# Overrides what "auto" picks (float32 or bfloat16): tests pin float32 with it, so their
# exact comparisons hold on CPUs with and without AMX.
ENV = "T2T_DECODE_DTYPE"


BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of bfloat16 products in hardware


def cpu_multiplies_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
  """Whether the CPU lists one of BF16_FLAGS among its flags (False where cpuinfo is
  unreadable)."""
  try:
    with open(cpuinfo, encoding="utf-8", errors="replace") as f:
      for line in f:
        if line.startswith("flags"):
          return any(flag in BF16_FLAGS for flag in line.partition(":")[2].split())
  except OSError:
    pass
  return False


def decode_dtype(
  requested: str, config_dtype: str, platform: str, cpuinfo: str = "/proc/cpuinfo"
) -> str:
  """The dtype to decode in. 'float32'/'bfloat16': that. 'auto': $T2T_DECODE_DTYPE when set;
  on a CPU, bfloat16 where it multiplies bfloat16 in hardware (AMX or AVX512-BF16) and float32
  elsewhere (a model trained in bfloat16 on an accelerator included: converted bfloat16 is
  slower); on an accelerator, the dtype the model was configured with (`config_dtype`)."""
  if requested not in DTYPES:
    raise ValueError(f"dtype {requested!r}: use one of {', '.join(DTYPES)}")
  if requested != "auto":
    return requested
  pinned = os.environ.get(ENV, "")
  if pinned:
    if pinned not in DTYPES[1:]:
      raise ValueError(f"${ENV}={pinned!r}: use float32 or bfloat16")
    return pinned
  if platform == "cpu":
    return "bfloat16" if cpu_multiplies_bf16(cpuinfo) else "float32"
  return str(config_dtype)
