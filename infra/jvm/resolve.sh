#!/usr/bin/env bash
# Resolves the pinned JVM parts (infra/jvm/pom.xml and its modules) into build/jvm/<module>/, once:
# again only when a pom changed. Maven and Java come from infra/install.sh. Offline after this.
set -euo pipefail
cd "$(dirname "$0")/../.."
stamp=build/jvm/.resolved
if [ -f "$stamp" ] && [ -z "$(find infra/jvm -name pom.xml -newer "$stamp")" ]; then
    exit 0
fi
command -v mvn >/dev/null 2>&1 || { echo "resolve.sh: mvn not found: run infra/install.sh as root (it installs Debian's maven)" >&2; exit 1; }
echo "resolving the pinned JVM parts (infra/jvm/pom.xml) into build/jvm (the first time downloads about 180 MB)" >&2
rm -rf build/jvm
mvn -q -B -f infra/jvm/pom.xml package
touch "$stamp"
