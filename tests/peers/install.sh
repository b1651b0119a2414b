#!/usr/bin/env bash
# Installs the third-party RocketMQ peers the peer tests and benchmarks drive:
#   1. rmq-loadgen + rmq-echo (Rust, std only) from tools/rmq-loadgen, built offline into build/rmq-loadgen/release/
#   2. ali-ons 3.12.0 (npm), from tests/peers/node/package-lock.json, into tests/peers/node/node_modules/
#   3. a check that the C++ client of PyPI rocketmq==0.4.4 loads in the project's venv
#      (installed by `pip install -e '.[test]'`), installing the Debian libraries it links to if absent.
# Idempotent: a second run changes nothing and takes about a second.  Quiet: one line on success;
# on failure, the step, the tool's last output lines and what to do.  PEERS_VERBOSE=1 shows each step.
#
# Environment: PYTHON (default <repo>/.venv/bin/python), RMQ_LOADGEN_SRC (default
# <repo>/tools/rmq-loadgen), RMQ_LOADGEN_TARGET (default <repo>/build/rmq-loadgen).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
NODE_DIR=$HERE/node
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
LOADGEN_SRC=${RMQ_LOADGEN_SRC:-$REPO/tools/rmq-loadgen}
LOADGEN_TARGET=${RMQ_LOADGEN_TARGET:-$REPO/build/rmq-loadgen}
ONS_VERSION=3.12.0
MIN_NODE_MAJOR=18   # util.parseArgs, used by ons_probe.js

LOG=$(mktemp -t peers-install.XXXXXX)
trap 'rm -f "$LOG"' EXIT

say() { if [ -n "${PEERS_VERBOSE:-}" ]; then printf 'peers: %s\n' "$*" >&2; fi; }

# die STEP MESSAGE [HINT...]: the failing step, the tool's own last lines, then what to do
die() {
    local step=$1 msg=$2
    shift 2
    printf 'tests/peers/install.sh: %s failed: %s\n' "$step" "$msg" >&2
    if [ -s "$LOG" ]; then
        printf -- '--- last output ---\n' >&2
        tail -n 15 "$LOG" >&2
        printf -- '-------------------\n' >&2
    fi
    local hint
    for hint in "$@"; do printf '  what to do: %s\n' "$hint" >&2; done
    exit 1
}

# run CMD...: run quietly, keeping the output for die
run() { : >"$LOG"; "$@" >"$LOG" 2>&1; }

build_loadgen() {
    say "building rmq-loadgen from $LOADGEN_SRC"
    [ -f "$LOADGEN_SRC/Cargo.toml" ] ||
        die "rmq-loadgen" "no Cargo.toml in $LOADGEN_SRC" \
            "restore it from git (git checkout -- tools/rmq-loadgen), or set RMQ_LOADGEN_SRC to the crate's folder"
    command -v cargo >/dev/null ||
        die "rmq-loadgen" "cargo is not on PATH" \
            "install a Rust toolchain with cargo 1.78 or newer (it reads the version-4 Cargo.lock; Debian 12's cargo is older), or add ~/.cargo/bin to PATH"
    # std only, so --offline needs no registry (crates.io may be unreachable); everything cargo writes
    # goes to the target dir, so the source folder stays clean and may be read-only
    run cargo build --release --offline --quiet \
        --manifest-path "$LOADGEN_SRC/Cargo.toml" --target-dir "$LOADGEN_TARGET" ||
        die "rmq-loadgen" "cargo build --release --offline" \
            "the crate uses only std, so a failure here is a toolchain or source problem: read the output above"
    local bin
    for bin in rmq-loadgen rmq-echo; do
        [ -x "$LOADGEN_TARGET/release/$bin" ] ||
            die "rmq-loadgen" "$LOADGEN_TARGET/release/$bin missing after the build" "rebuild with PEERS_VERBOSE=1"
    done
}

install_ons() {
    say "installing ali-ons $ONS_VERSION in $NODE_DIR"
    command -v node >/dev/null && command -v npm >/dev/null ||
        die "ali-ons" "node or npm is not on PATH" \
            "install Node.js >= $MIN_NODE_MAJOR and npm (Debian: apt-get install nodejs npm)"
    local major
    major=$(node -p 'process.versions.node.split(".")[0]')
    [ "$major" -ge "$MIN_NODE_MAJOR" ] ||
        die "ali-ons" "node $(node --version) is older than $MIN_NODE_MAJOR" "install Node.js >= $MIN_NODE_MAJOR"
    [ -f "$NODE_DIR/package-lock.json" ] ||
        die "ali-ons" "tests/peers/node/package-lock.json is missing" \
            "restore it from git (git checkout -- tests/peers/node/package-lock.json)"

    # npm ci always wipes node_modules; skip it when the same lock file was installed by the same node
    local stamp want
    stamp=$NODE_DIR/node_modules/.peers-install-stamp
    want="$(sha256sum "$NODE_DIR/package-lock.json" | cut -d' ' -f1) node-$major"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
        [ "$(installed_ons_version)" = "$ONS_VERSION" ]; then
        say "ali-ons already installed"
        return
    fi
    (cd "$NODE_DIR" && run npm ci --no-audit --no-fund --loglevel=error) ||
        die "ali-ons" "npm ci in tests/peers/node" \
            "check that the npm registry is reachable (npm ping), then rerun this script"
    local got
    got=$(installed_ons_version)
    [ "$got" = "$ONS_VERSION" ] ||
        die "ali-ons" "installed ali-ons is '$got', expected $ONS_VERSION" \
            "package.json pins ali-ons $ONS_VERSION: regenerate the lock file with npm install there"
    printf '%s\n' "$want" >"$stamp"
}

installed_ons_version() {
    node -p "require('$NODE_DIR/node_modules/ali-ons/package.json').version" 2>/dev/null || true
}

# Debian packages that provide the shared libraries librocketmq.so links to (zlib is bundled)
declare -A DEBIAN_PACKAGE_OF=(
    [libstdc++.so.6]=libstdc++6
    [libgcc_s.so.1]=libgcc-s1
    [libz.so.1]=zlib1g
    [libpthread.so.0]=libc6
    [libdl.so.2]=libc6
    [librt.so.1]=libc6
    [libm.so.6]=libc6
    [libc.so.6]=libc6
)

check_cpp_client() {
    say "checking the rocketmq (C++ client) package in $PYTHON"
    [ -x "$PYTHON" ] ||
        die "rocketmq" "no Python at $PYTHON" \
            "create the venv: python3.11 -m venv .venv && .venv/bin/pip install -e '.[test]' (or set PYTHON)"
    if run "$PYTHON" -c 'import rocketmq.client'; then
        return
    fi
    if grep -q "No module named 'rocketmq'" "$LOG"; then
        die "rocketmq" "the rocketmq package is not installed in $PYTHON" \
            "$PYTHON -m pip install -e '$REPO[test]' (it pins rocketmq==0.4.4; x86_64 Linux only)"
    fi
    install_missing_libs
    run "$PYTHON" -c 'import rocketmq.client' ||
        die "rocketmq" "import rocketmq.client still fails" \
            "read the loader error above; the wheel ships librocketmq.so for x86_64 glibc Linux only"
}

install_missing_libs() {
    local lib
    lib=$("$PYTHON" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("rocketmq").origin), "librocketmq.so"))')
    [ -f "$lib" ] || die "rocketmq" "$lib is missing from the wheel" "$PYTHON -m pip install --force-reinstall rocketmq==0.4.4"
    local missing packages=() so pkg
    missing=$(ldd "$lib" | awk '/not found/ {print $1}')
    [ -n "$missing" ] ||
        die "rocketmq" "import rocketmq.client fails but ldd finds every library" "read the error above"
    for so in $missing; do
        pkg=${DEBIAN_PACKAGE_OF[$so]:-}
        [ -n "$pkg" ] || die "rocketmq" "librocketmq.so needs $so, which this script cannot map to a Debian package" \
            "find it with apt-file search $so and install it"
        dpkg -s "$pkg" >/dev/null 2>&1 || packages+=("$pkg")
    done
    [ ${#packages[@]} -gt 0 ] ||
        die "rocketmq" "libraries not found: $missing, yet their packages are installed" "check ldconfig -p"
    [ "$(id -u)" -eq 0 ] ||
        die "rocketmq" "missing Debian packages: ${packages[*]}" "as root: apt-get update && apt-get install -y ${packages[*]}"
    say "installing Debian packages ${packages[*]}"
    run apt-get update -q || die "rocketmq" "apt-get update" "check that the Debian mirror is reachable"
    DEBIAN_FRONTEND=noninteractive run apt-get install -y -q --no-install-recommends "${packages[@]}" ||
        die "rocketmq" "apt-get install ${packages[*]}" "install them by hand, then rerun this script"
}

build_loadgen
install_ons
check_cpp_client
printf 'peers ready: %s/release/{rmq-loadgen,rmq-echo}; ali-ons %s in tests/peers/node; rocketmq 0.4.4 (C++ client 1.0.1) in %s\n' \
    "${LOADGEN_TARGET#"$REPO"/}" "$ONS_VERSION" "$PYTHON"
