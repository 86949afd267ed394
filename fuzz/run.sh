#!/usr/bin/env bash
# Runs each fuzz target for a bounded time (FUZZ_SECONDS, default 60) with
# cargo-fuzz and libFuzzer on the nightly toolchain, seeding each corpus from
# fuzz/seeds/<target>/. Prints libFuzzer's final numbers per target and exits
# non-zero if any target found a crash (its input lands in
# fuzz/artifacts/<target>/; replay with `cargo +nightly fuzz run <target> <file>`).
#
#   fuzz/run.sh                    # every target, 60 s each
#   FUZZ_SECONDS=300 fuzz/run.sh ws_client_frames
#
# Needs: rustup's nightly toolchain and `cargo install cargo-fuzz`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

seconds="${FUZZ_SECONDS:-60}"
all_targets=(http_request json_bodies ws_client_frames)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all_targets[@]}")

# Longest input per target: the HTTP stream must be able to pass the 16 KiB
# head cap (431); JSON programs and WebSocket frame descriptions are compact
# (their builders expand to large texts and frames on their own).
max_len() {
    case "$1" in
        http_request) echo 20480 ;;
        json_bodies) echo 4096 ;;
        ws_client_frames) echo 4096 ;;
        *) echo 4096 ;;
    esac
}

cargo +nightly fuzz --version >/dev/null 2>&1 || {
    echo "cargo-fuzz missing: cargo install cargo-fuzz" >&2
    exit 2
}
cargo +nightly fuzz build

mkdir -p logs
failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="logs/$t.log"
    echo "== $t: ${seconds}s, max_len $(max_len "$t")"
    status=0
    cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" \
        -max_len="$(max_len "$t")" \
        -timeout=10 \
        -rss_limit_mb=2048 \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    # The last status line carries the coverage (cov:) and features (ft:).
    grep -E '^#[0-9]+' "$log" | tail -n 1 || true
    grep -E 'stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
    if [[ $status -ne 0 ]]; then
        echo "!! $t failed (exit $status); see fuzz/$log and fuzz/artifacts/$t/"
        grep -E -m 5 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" || true
        failed+=("$t")
    fi
done

if [[ ${#failed[@]} -ne 0 ]]; then
    echo "crashes found in: ${failed[*]}"
    exit 1
fi
echo "no crashes"
