#!/usr/bin/env bash
# Makes Prometheus 2.x's `prometheus` and `promtool` available to the tests:
# tests/suite/prometheus_rules.rs checks the shipped alert rules
# (src/reporter/alerts.yml) and their unit tests (src/reporter/alerts_test.yml)
# with promtool, and tests that scrape the reporter start their own
# `prometheus` server.
#   - If `prometheus` and `promtool` are both on PATH, in one directory, it
#     installs nothing.
#   - Otherwise it installs Debian's `prometheus` package with apt-get
#     (/usr/bin/prometheus, /usr/bin/promtool) without starting its service:
#     while apt-get runs, a policy-rc.d that refuses every service start is in
#     place (unless the machine already has one, such as Docker's), and on a
#     machine run by systemd the unit is then disabled and stopped, so no
#     packaged server ever listens on :9090 beside the tests' own.
# Idempotent: a second run installs nothing. Runs `apt-get update` only when
# apt does not know the package or a download from a stale list fails.
#
# Quiet: on success it prints one line, the directory holding `prometheus`
# and `promtool` (the tests read it from WARDEN_PROMETHEUS_BIN, and look on
# PATH when that is unset). On failure it names the step and shows its output.
#
# Usage: tests/prometheus/setup.sh
set -euo pipefail

package=prometheus
policy=/usr/sbin/policy-rc.d

log=$(mktemp)
own_policy=false
cleanup() {
    rm -f "$log"
    if $own_policy; then rm -f "$policy"; fi
}
trap cleanup EXIT

fail() {
    echo "tests/prometheus/setup.sh: $*" >&2
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

# The directory holding both `prometheus` and `promtool`, if PATH has them
# side by side.
bin_dir() {
    local promtool
    promtool=$(command -v promtool 2>/dev/null) || return 1
    local dir
    dir=$(dirname "$promtool")
    [ -x "$dir/prometheus" ] || return 1
    echo "$dir"
}

export DEBIAN_FRONTEND=noninteractive
# Wait for another apt or dpkg (another setup script) rather than fail.
apt_options=(-o DPkg::Lock::Timeout=300)
apt_updated=false
apt_update() {
    if ! $apt_updated; then
        quiet apt-get "${apt_options[@]}" update -qq
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
    if apt-get "${apt_options[@]}" "$@" >"$log" 2>&1; then
        return
    fi
    if $apt_updated; then
        fail "failed: apt-get $*"
    fi
    apt_update
    quiet apt-get "${apt_options[@]}" "$@"
}

# 1. The package, its service never started.
if ! bin_dir >/dev/null; then
    need_root "install Debian's $package package"
    if [ ! -e "$policy" ]; then
        # invoke-rc.d asks this before starting a service; 101: "action
        # forbidden". Removed on exit, whatever happens.
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=true
    fi
    apt_get install -y -qq --no-install-recommends "$package"
    if [ -d /run/systemd/system ]; then
        quiet systemctl disable --now prometheus.service
    fi
    bin_dir >/dev/null || fail "no prometheus and promtool side by side on PATH after installing $package"
fi

# 2. A smoke run: both start and name a 2.x version.
dir=$(bin_dir)
for tool in prometheus promtool; do
    "$dir/$tool" --version >"$log" 2>&1 || fail "$dir/$tool --version failed"
    grep -q "^$tool, version 2\." "$log" || fail "$dir/$tool is not Prometheus 2.x"
done

echo "$dir"
