#!/usr/bin/env bash
# Nothing acknowledged is lost, counted: four clients post prompts,
# answers, cancels, asks and replies while the server (with a data
# directory, RELAY_SYNC=always) is killed with SIGKILL at random moments
# and restarted on the same directory, 20 times (CRASH_ROUNDS). After
# every restart: everything that got a 200 is there with its seq (a
# cancelled prompt not pending and an answer to it refused 409; an ask
# never replied to still open; a replied one answered, refusing another
# reply), nothing refused is, seq has no holes or repeats, the pending set
# is right, the epoch is the same, and a resent id is a duplicate.
# Then the same with RELAY_HISTORY_LIMIT=50, so the kills land while
# history is trimmed and dropped rows are deleted: seq has no holes, every
# acknowledged prompt never answered is still pending and a duplicate.
# `cargo test` runs the same tests with 5 rounds.
#
#   scripts/crash-test.sh
#   CRASH_ROUNDS=50 scripts/crash-test.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CRASH_ROUNDS="${CRASH_ROUNDS:-20}" cargo test --release --test storage \
  -- --nocapture kill_9_in_the_middle_of_traffic_loses_nothing_acknowledged \
  kill_9_with_a_short_history_loses_no_pending_prompt_and_no_seq
