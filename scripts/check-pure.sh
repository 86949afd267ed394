#!/usr/bin/env bash
# The sans-IO cores never touch a socket or read the clock: time and bytes
# are parameters, so their tests run on a virtual clock (the first paragraph
# of docs/src/architecture.md). Fails if mio, a std socket type, or a clock
# read appears in them, comments included.
#
# Checked: every file under the paths in `pure`, except the files in
# `shell`. Those are the shell's disk inside the store: the SQLite storage
# thread (src/store/sqlite/thread.rs: commit times, a disk operation
# overdue, the loop woken through its mio::Waker) and the loop's handle on
# it (src/store/sqlite/handle.rs: it hands the thread that waker and bounds
# the shutdown by the clock). The rest of src/store/sqlite (opening the
# database, the writer, rows, schema, the generation file, the
# checkpointer) is checked like the cores. A file listed in `shell` that
# does not exist fails the check, so the list cannot outlive the code.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pure=(src/relay src/store src/http src/api.rs src/api src/timer.rs src/keepalive.rs src/ratelimit.rs src/web src/config.rs src/config src/net/ws_read.rs)
shell=(src/store/sqlite/thread.rs src/store/sqlite/handle.rs)
pattern='\bmio\b|std::net::(TcpStream|TcpListener|UdpSocket)|\bTcpStream\b|\bTcpListener\b|Instant::now|SystemTime::now'
for f in "${shell[@]}"; do
  if [[ ! -f "$f" ]]; then
    echo "check-pure: $f is left out of the check but does not exist: update \`shell\`" >&2
    exit 1
  fi
done
existing=()
for p in "${pure[@]}"; do [[ -e "$p" ]] && existing+=("$p"); done
files=()
while IFS= read -r f; do
  skip=0
  for s in "${shell[@]}"; do [[ "$f" == "$s" ]] && skip=1; done
  ((skip)) || files+=("$f")
done < <(find "${existing[@]}" -name '*.rs' -type f | sort)
if hits=$(grep -HnE "$pattern" "${files[@]}"); then
  echo "check-pure: I/O or a clock read in a pure module:" >&2
  echo "$hits" >&2
  exit 1
fi
echo "check-pure: ${#files[@]} files in ${#existing[@]} pure module paths clean (${#shell[@]} shell files left out)"
