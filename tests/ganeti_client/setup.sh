#!/usr/bin/env bash
# Makes Ganeti 3.0's own Python WConfD client available to the tests in
# tests/suite/ganeti_client.rs:
#   - installs, with apt-get, the Debian packages the client imports
#     (python3-openssl, python3-pyparsing, python3-bitarray, python3-simplejson),
#   - extracts Debian's ganeti-3.0 package (not installed: only its Python
#     tree is used) into a cache directory, target/ganeti-3.0 by default.
# It also installs strace, the other outside tool of the test suite:
# tests/suite/sync_faults.rs injects failing syncs into the daemons with it.
# Idempotent: a second run installs and downloads nothing. Runs
# `apt-get update` only when apt does not know a package or a download from a
# stale package list fails.
#
# Quiet: on success it prints one line, the PYTHONPATH to use (the tests read
# it from WARDEN_GANETI_PYTHONPATH, and look in the default cache directory
# when that is unset). On failure it names the step and shows its output.
#
# Usage: tests/ganeti_client/setup.sh [CACHE_DIR]
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${1:-$repo/target/ganeti-3.0}
python=/usr/bin/python3
python_packages=(python3 python3-openssl python3-pyparsing python3-bitarray python3-simplejson)
python_modules="OpenSSL, pyparsing, bitarray, simplejson"
ganeti_package=ganeti-3.0
pythonpath=$cache/usr/share/ganeti/3.0

log=$(mktemp)
work=
cleanup() {
    rm -f "$log"
    if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT

fail() {
    echo "tests/ganeti_client/setup.sh: $*" >&2
    if [ -s "$log" ]; then sed 's/^/    /' "$log" >&2; fi
    exit 1
}

# Runs a command with its output in $log; stops with that output on failure.
quiet() {
    "$@" >"$log" 2>&1 || fail "failed: $*"
}

need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        fail "must run as root to $* (or run it once as root; later runs need nothing)"
    fi
}

export DEBIAN_FRONTEND=noninteractive
apt_updated=false
apt_update() {
    if ! $apt_updated; then
        quiet apt-get update -qq
        apt_updated=true
    fi
}

# Whether apt has a candidate version of every named package.
apt_knows() {
    local package
    for package in "$@"; do
        # Not a pipe into `grep -q`: with pipefail, an early exit of grep
        # could fail the pipeline.
        local policy
        policy=$(apt-cache policy "$package" 2>/dev/null) || return 1
        [[ $policy == *"Candidate: "[!\(]* ]] || return 1
    done
}

# Runs an apt-get command; if it fails on a package list that was not just
# updated (a stale list names files the mirror no longer has), updates and
# runs it once more.
apt_get() {
    apt_knows "${@: -1}" || apt_update
    if apt-get "$@" >"$log" 2>&1; then
        return
    fi
    if $apt_updated; then
        fail "failed: apt-get $*"
    fi
    apt_update
    quiet apt-get "$@"
}

# 0. strace, for the failing-sync tests.
if ! command -v strace >/dev/null 2>&1; then
    need_root "install strace"
    apt_get install -y -qq --no-install-recommends strace
    command -v strace >/dev/null 2>&1 || fail "no strace after installing it"
fi

# 1. The Python packages, with the system's Python 3 (Ganeti's client is
# run with /usr/bin/python3, never a virtualenv's).
if ! "$python" -c "import $python_modules" >/dev/null 2>&1; then
    need_root "install ${python_packages[*]}"
    apt_knows "${python_packages[@]}" || apt_update
    apt_get install -y -qq --no-install-recommends "${python_packages[@]}"
    "$python" -c "import $python_modules" >"$log" 2>&1 ||
        fail "$python cannot import $python_modules after installing ${python_packages[*]}"
fi

# 2. Ganeti's Python tree. Extracted next to the cache directory and renamed
# into place, so an interrupted run never leaves a partial tree behind.
if [ ! -f "$pythonpath/ganeti/wconfd.py" ]; then
    mkdir -p "$(dirname "$cache")"
    work=$(mktemp -d "$cache.tmp.XXXXXX")
    # apt downloads as the unprivileged user _apt where it can.
    chmod 755 "$work"
    (cd "$work" && apt_get download "$ganeti_package")
    debs=("$work"/"$ganeti_package"_*.deb)
    [ -f "${debs[0]}" ] || fail "apt-get download $ganeti_package left no .deb in $work"
    quiet dpkg-deb -x "${debs[0]}" "$work/root"
    [ -f "$work/root/usr/share/ganeti/3.0/ganeti/wconfd.py" ] ||
        fail "${debs[0]} has no usr/share/ganeti/3.0/ganeti/wconfd.py"
    rm -rf "$cache"
    mv "$work/root" "$cache"
fi

# 3. A smoke import: the client and the livelocks load with this PYTHONPATH.
PYTHONPATH=$pythonpath "$python" -c "import ganeti.wconfd, ganeti.utils.livelock" >"$log" 2>&1 ||
    fail "$python cannot import Ganeti's WConfD client from $pythonpath"

echo "$pythonpath"
