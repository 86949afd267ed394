#!/usr/bin/env bash
# Start the static-answer nginx in the foreground: run.sh PORT
# One worker process, listening on 127.0.0.1:PORT only, with its own pid, log
# and temp paths under /tmp/relay-nginx-static-PORT (the system nginx is not
# touched). The pid of this script becomes the nginx master (exec); stop it
# with SIGTERM.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
port="${1:?usage: run.sh PORT}"
case "$port" in (*[!0-9]*|'') echo "run.sh: bad port: $port" >&2; exit 2;; esac
command -v nginx >/dev/null || { echo "run.sh: needs nginx (apt-get install -y nginx)" >&2; exit 3; }
prefix="/tmp/relay-nginx-static-$port"
rm -rf "$prefix"
mkdir -p "$prefix"
sed -e "s|__PORT__|$port|g" -e "s|__PREFIX__|$prefix|g" "$here/nginx.conf" > "$prefix/nginx.conf"
exec nginx -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/error.log"
