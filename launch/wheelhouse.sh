#!/usr/bin/env bash
# t2t_jax for a machine without network (a cluster's GPU nodes): a directory of wheels built
# where there is network, installed there with `pip install --no-index`. The logic that needs
# no network (what the target lacks, what to leave out, the manifest) is launch/wheelhouse.py.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/wheelhouse.sh build --dir DIR [--have FILE] [--python-version X.Y]
                                  [--platform TAG] [--extra NAME]... [--find-links DIR2]
       launch/wheelhouse.sh install --dir DIR [--editable]

build, on a machine with network: puts into DIR the wheel of t2t_jax and a wheel of each
package it needs on the target, with DIR/requirements.txt and DIR/manifest.json (the files,
their sizes and sha256, and what was left out). Wheels only: pip fetches no sdist for another
platform, so a package published only as an sdist is built into a wheel here, which is kept
only when it is pure Python; otherwise build stops and names it (build that wheel on a machine
like the target with `pip wheel --no-deps NAME` and pass its folder with --find-links).
  --dir DIR               where the wheelhouse goes: a new or empty directory, or one that an
                          earlier build made (its wheels that this build does not need go)
  --have FILE             only what the target lacks: FILE lists what it has, written there by
                          `python3 launch/wheelhouse.py freeze > FILE` (which also records its
                          Python version and platform) or `pip list --format=freeze > FILE`.
                          Without it, DIR holds everything (for a bare Python)
  --python-version X.Y    the target's Python (default: FILE's header, else $PYTHON's here)
  --platform TAG          the target's platform, manylinux_2_G_ARCH for glibc 2.G (`ldd
                          --version` there), e.g. manylinux_2_28_x86_64; older manylinux
                          wheels are accepted too (default: FILE's header, else this machine's)
  --implementation cp     (default: FILE's header, else $PYTHON's here)
  --extra NAME            an extra of setup.cfg as well, e.g. cuda12 (jax's CUDA 12 wheels,
                          ~3 GB) for a target without a CUDA-enabled jax; repeatable
  --find-links DIR2       wheels built elsewhere (on a machine like the target) to use as well

install, on the target, from a checkout: checks every file of DIR against its manifest, runs
`pip install --no-index --find-links DIR -r DIR/requirements.txt` (with --editable,
`pip install --no-index --find-links DIR -e CHECKOUT[EXTRAS]` instead), then checks that
nothing t2t_jax needs is missing.

Both take --dry-run (or DRY_RUN=1): print the pip commands instead of running them. PYTHON
(default python3) is the interpreter whose pip runs: for build, with pip >= 22.2 (--report);
for install, the environment installed into.

Examples:
  there: python3 launch/wheelhouse.py freeze > have.txt                    (copy it here)
  here:  launch/wheelhouse.sh build --dir /tmp/wheels --have have.txt     (copy DIR there)
  there: launch/wheelhouse.sh install --dir wheels
EOF
}

fail() {
  echo "wheelhouse: $*" >&2
  exit 2
}

show() {
  printf '+'
  printf ' %q' "$@"
  echo
}

run() {
  show "$@"
  [[ -n "$dry_run" ]] || "$@"
}

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
python=${PYTHON:-python3}
helper=("$python" "$here/wheelhouse.py")
dry_run=${DRY_RUN:-}
[[ "$dry_run" != 0 ]] || dry_run=""

command=${1:-}
case "$command" in
  -h | --help) usage; exit 0 ;;
  build | install) shift ;;
  "") usage >&2; exit 2 ;;
  *) echo "wheelhouse: unknown command $command (build or install)" >&2; usage >&2; exit 2 ;;
esac

dir="" have="" python_version="" platform="" implementation="" editable=""
extras=() find_links=()
while (($#)); do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --dry-run | --dry_run) dry_run=1; shift; continue ;;
    --editable) editable=1; shift; continue ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
  esac
  case "$1" in
    --dir | --have | --python-version | --platform | --implementation | --extra | --find-links)
      (($# >= 2)) || fail "$1 needs a value"
      case "$1" in
        --dir) dir=$2 ;;
        --have) have=$2 ;;
        --python-version) python_version=$2 ;;
        --platform) platform=$2 ;;
        --implementation) implementation=$2 ;;
        --extra) extras+=("$2") ;;
        --find-links) find_links+=("$2") ;;
      esac
      shift 2
      ;;
    *) fail "unknown argument $1 (see --help)" ;;
  esac
done

[[ -n "$dir" ]] || fail "$command needs --dir DIR"

do_install() {
  [[ -z "$have$python_version$platform$implementation${extras[*]}${find_links[*]}" ]] ||
    fail "install takes only --dir, --editable and --dry-run: the rest is fixed at build"
  [[ -f "$dir/requirements.txt" && -f "$dir/manifest.json" ]] ||
    fail "$dir has no requirements.txt and manifest.json: not a wheelhouse that build made"
  if [[ -z "$dry_run" ]]; then
    "${helper[@]}" verify --dir "$dir" || fail "$dir does not match its manifest (above)"
  fi
  local spec what
  spec=$(head -n 1 "$dir/requirements.txt")
  if [[ -n "$editable" ]]; then
    local bracket=${spec%%==*}
    bracket=${bracket#"${bracket%%[*}"}
    what=(-e "$repo$bracket")
  else
    what=(-r "$dir/requirements.txt")
  fi
  run "$python" -m pip install --no-index --find-links "$dir" "${what[@]}"
  [[ -z "$dry_run" ]] || return 0
  local missing
  if ! missing=$("${helper[@]}" check --wheelhouse "$dir"); then
    echo "wheelhouse: installed, yet $python still lacks:" >&2
    local lines
    mapfile -t lines <<<"$missing"
    printf '  %s\n' "${lines[@]}" >&2
    exit 1
  fi
  echo "wheelhouse: installed; $python has everything t2t_jax needs"
}

do_build() {
  [[ -z "$editable" ]] || fail "--editable is an option of install"
  [[ -z "$have" || -f "$have" ]] || fail "--have $have: no such file"
  local links
  for links in "${find_links[@]}"; do
    [[ -d "$links" ]] || fail "--find-links $links: no such directory"
  done
  if [[ -d "$dir" && -n "$(ls -A "$dir")" && ! -e "$dir/.wheelhouse" ]]; then
    fail "$dir holds files that no earlier build put there: give a new or empty directory"
  fi
  local target_args=() extra_args=() extra
  [[ -z "$have" ]] || target_args+=(--have "$have")
  [[ -z "$python_version" ]] || target_args+=(--python-version "$python_version")
  [[ -z "$platform" ]] || target_args+=(--platform "$platform")
  [[ -z "$implementation" ]] || target_args+=(--implementation "$implementation")
  for extra in "${extras[@]}"; do
    extra_args+=(--extra "$extra")
  done
  local target
  target=$("${helper[@]}" target "${target_args[@]}" "${extra_args[@]}") || exit 2
  local -a lines platforms
  mapfile -t lines <<<"$target"
  local pyver=${lines[0]} impl=${lines[1]}
  platforms=("${lines[@]:2}")
  local pip_target=(--only-binary=:all: --python-version "$pyver" --implementation "$impl")
  local tag
  for tag in "${platforms[@]}"; do
    pip_target+=(--platform "$tag")
  done
  echo "wheelhouse: for Python $pyver ($impl) on ${platforms[0]}${have:+, less what $have lists}"

  local pip_version
  pip_version=$("$python" -m pip --version | awk '{print $2}')
  if ! printf '%s\n' 22.2 "$pip_version" | sort -V -C; then
    fail "pip $pip_version of $python has no --report (22.2 and later do): upgrade it here"
  fi
  local own
  own=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [[ "$own" != "$pyver" ]] && ! printf '%s\n' 24.2 "$pip_version" | sort -V -C; then
    # Older pips check Requires-Python against their own interpreter, not --python-version.
    fail "pip $pip_version picks packages for Python $own, not $pyver: upgrade it" \
      "($python -m pip install -U pip; 24.2 and later do it right) or use a PYTHON $pyver"
  fi

  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/wheelhouse.XXXXXX")
  # shellcheck disable=SC2064  # $work is fixed now; the trap is to remove this one
  trap "rm -rf '$work'" EXIT
  mkdir "$work/src" "$work/local"

  local version bracket=""
  version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/t2t_jax/__init__.py")
  if ((${#extras[@]})); then
    bracket="[$(IFS=,; echo "${extras[*]}")]"
  fi
  local requirement="t2t_jax$bracket==$version"
  local tools
  mapfile -t tools < <("${helper[@]}" build-requirements)

  # The wheel is built from a copy, as a build in the checkout would leave build/ there and
  # a stale build/lib can put deleted modules into the wheel. In a git checkout the copy is
  # the files git knows or would add (ignored caches, which running tests may be writing,
  # stay out); elsewhere everything but the usual build and cache folders.
  if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    local f
    git -C "$repo" ls-files -z --cached --others --exclude-standard \
      | while IFS= read -r -d '' f; do [[ -e "$repo/$f" ]] && printf '%s\0' "$f"; done \
      | tar -C "$repo" --null -T - -cf - | tar -C "$work/src" -xf -
  else
    tar -C "$repo" --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
      --exclude=./workdirs --exclude=./.whl --exclude=./.cache --exclude=./.pytest_cache \
      --exclude=__pycache__ --exclude='*.egg-info' -cf - . | tar -C "$work/src" -xf -
  fi
  run "$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/local" "$work/src"
  if [[ -z "$dry_run" && ! -f "$work/local/t2t_jax-$version-py3-none-any.whl" ]]; then
    fail "building the t2t_jax wheel gave no t2t_jax-$version-py3-none-any.whl"
  fi
  for links in "${find_links[@]}"; do
    cp "$links"/*.whl "$work/local/" 2>/dev/null || fail "--find-links $links holds no wheel"
  done

  local constraints=()
  if [[ -n "$have" ]]; then
    mkdir "$work/stubs"
    "${helper[@]}" constraints --have "$have" --stubs "$work/stubs" "${extra_args[@]}" \
      >"$work/constraints.txt"
    constraints=(-c "$work/constraints.txt" --find-links "$work/stubs")
  fi

  # --target: older pips take the platform options only with it; --dry-run writes nothing there.
  local resolve=("$python" -m pip install --dry-run --ignore-installed
    --target "$work/target" --report "$work/report.json" "${pip_target[@]}"
    --find-links "$work/local" "${constraints[@]}")
  local wanted=("$requirement" "${tools[@]}")
  if [[ -n "$dry_run" ]]; then
    show "${resolve[@]}" "${wanted[@]}"
    show "$python" -m pip download --no-deps --quiet "${pip_target[@]}" -d "$dir" \
      "(each package of the resolve that the target lacks)"
    return 0
  fi

  # The target resolve takes wheels only. When it fails, a resolve for this machine that may
  # take sdists shows which packages come only as sdists; pure Python wheels of them built
  # here let the target resolve go through on the next try. When it succeeds, requirements
  # that hold on the target's Python only (pip evaluates markers for the Python it runs on,
  # whatever --python-version says) are checked, and the resolve done again with those unmet.
  local attempt=0 native="" item
  while :; do
    attempt=$((attempt + 1))
    show "${resolve[@]}" "${wanted[@]}"
    # Not --quiet: pip says which packages have no wheel for the target only at info level.
    if "${resolve[@]}" "${wanted[@]}" >"$work/resolve.log" 2>&1; then
      local unfit=()
      mapfile -t unfit < <("${helper[@]}" fit "$work/report.json" --python-version "$pyver")
      ((${#unfit[@]})) || break
      if ((attempt >= 5)); then
        fail "the resolve does not settle for Python $pyver (pip reads the markers for" \
          "Python $own): build with a PYTHON $pyver"
      fi
      wanted+=("${unfit[@]}")
      continue
    fi
    local sdists=()
    if [[ -z "$native" ]]; then
      native=("$python" -m pip install --dry-run --ignore-installed --quiet --prefer-binary
        --target "$work/target" --report "$work/native.json" --find-links "$work/local"
        "${constraints[@]}" "${wanted[@]}")
      show "${native[@]}"
      if "${native[@]}" >"$work/native.log" 2>&1; then
        mapfile -t sdists < <("${helper[@]}" sdists "$work/native.json")
      fi
    fi
    if ((${#sdists[@]} == 0)); then
      awk '/^ERROR:/ { shown = 1 } shown' "$work/resolve.log" >&2
      echo "wheelhouse: the resolve for the target failed (pip's message above)" >&2
      exit 1
    fi
    for item in "${sdists[@]}"; do
      build_pure "$item"
    done
  done

  local plan_args=(--python-version "$pyver" --implementation "$impl")
  for tag in "${platforms[@]}"; do
    plan_args+=(--platform "$tag")
  done
  "${helper[@]}" plan "$work/report.json" --local "$work/local" ${have:+--have "$have"} \
    "${extra_args[@]}" "${plan_args[@]}" --requirement "$requirement" --out "$work/plan.json" \
    >"$work/downloads"
  local downloads
  mapfile -t downloads <"$work/downloads"
  mkdir -p "$dir"
  touch "$dir/.wheelhouse"
  if ((${#downloads[@]})); then
    run "$python" -m pip download --no-deps --quiet "${pip_target[@]}" -d "$dir" "${downloads[@]}"
  fi
  cp "$work"/local/*.whl "$dir/"
  "${helper[@]}" finish "$work/plan.json" --dir "$dir"
}

build_pure() {  # NAME==VERSION: a wheel built here from its sdist, kept only when pure Python
  local spec=$1 wheels
  rm -rf "$work/sdist"
  mkdir "$work/sdist"
  local wheel=("$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/sdist" "$spec")
  show "${wheel[@]}"
  if ! "${wheel[@]}" >"$work/sdist.log" 2>&1; then
    echo "wheelhouse: $spec has no wheel on the index, and building one here failed:" >&2
    cat "$work/sdist.log" >&2
    exit 1
  fi
  wheels=("$work"/sdist/*.whl)
  case "${wheels[0]##*/}" in
    *-none-any.whl)
      echo "wheelhouse: $spec has no wheel on the index; built ${wheels[0]##*/} (pure Python)"
      mv "${wheels[0]}" "$work/local/"
      ;;
    *)
      echo "wheelhouse: $spec has no wheel on the index and is not pure Python (here it" \
        "builds into ${wheels[0]##*/}): build it on a machine like the target with" \
        "\`pip wheel --no-deps $spec\` and pass that folder with --find-links" >&2
      exit 1
      ;;
  esac
}

"do_$command"
