#!/usr/bin/env bash
# The sans-IO cores never touch a socket or read the clock: time and bytes
# are parameters, so their tests run on a virtual clock (STYLE.md, habit 1).
# Fails if mio, a std socket type, or a clock read appears in them. The
# storage thread (src/store/sqlite) is the shell's disk, not a core.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pure=(src/relay src/store src/http src/api.rs src/api src/timer.rs src/keepalive.rs src/ratelimit.rs src/web src/config.rs src/config)
pattern='\bmio\b|std::net::(TcpStream|TcpListener|UdpSocket)|\bTcpStream\b|\bTcpListener\b|Instant::now|SystemTime::now'
existing=()
for p in "${pure[@]}"; do [[ -e "$p" ]] && existing+=("$p"); done
if hits=$(grep -rnE "$pattern" "${existing[@]}" --include='*.rs' --exclude-dir=sqlite); then
  echo "check-pure: I/O or a clock read in a pure module:" >&2
  echo "$hits" >&2
  exit 1
fi
echo "check-pure: ${#existing[@]} pure module paths clean"
