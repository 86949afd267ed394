#!/usr/bin/env bash
# Start the static-answer nginx in the foreground: run.sh PORT
# With NGINX_TLS_CERT and NGINX_TLS_KEY (PEM files) it listens with TLS.
# One worker process, listening on 127.0.0.1:PORT only, with its own pid, log
# and temp paths under /tmp/relay-nginx-static-PORT (the system nginx is not
# touched). The pid of this script becomes the nginx master (exec); stop it
# with SIGTERM.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
port="${1:?usage: run.sh PORT}"
case "$port" in (*[!0-9]*|'') echo "run.sh: bad port: $port" >&2; exit 2;; esac
command -v nginx >/dev/null || { echo "run.sh: needs nginx (apt-get install -y nginx)" >&2; exit 3; }
# TLS: the listen line gets `ssl`, the certificate pair a line before it.
tls=()
if [ -n "${NGINX_TLS_CERT:-}" ]; then
  tls=(-e "s|^\( *\)listen 127.0.0.1:[0-9]* |\1ssl_certificate ${NGINX_TLS_CERT}; ssl_certificate_key ${NGINX_TLS_KEY}; ssl_protocols TLSv1.2 TLSv1.3;\n&ssl |")
fi
prefix="/tmp/relay-nginx-static-$port"
rm -rf "$prefix"
mkdir -p "$prefix"
sed -e "s|__PORT__|$port|g" "${tls[@]}" -e "s|__PREFIX__|$prefix|g" "$here/nginx.conf" > "$prefix/nginx.conf"
exec nginx -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/error.log"
