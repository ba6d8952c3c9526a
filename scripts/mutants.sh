#!/usr/bin/env bash
# Mutation testing of the mailbox core: cargo-mutants changes the code of
# transport/src/mailbox/core.rs (credits, fallback, doorbell, close states)
# and reorder.rs (per-sender order) one mutant at a time and runs the
# transport crate's unit tests against each; a mutant the tests do not
# catch ("missed") is a behaviour no test holds. Not run by CI (it builds
# and tests every mutant: about 65 of them, tens of minutes on 2 cores).
#
#   scripts/mutants.sh                 # core.rs and reorder.rs
#   scripts/mutants.sh --file 'transport/src/mailbox/*.rs'   # the whole mailbox
#
# Results land in mutants.out/ (outcomes.json, caught.txt, missed.txt,
# unviable.txt, timeout.txt).
#
# Mutants known to survive because they do not change behaviour
# (equivalent), over transport/src/mailbox/*.rs:
# - `|` -> `^` in handle.rs `Internal::user_data` (twice) and `tagged`: the
#   fields OR-ed are disjoint bit ranges (value << 5, kind << 3 with kind
#   <= 3, a tag below 8; an 8-aligned address and a tag below 8), where
#   XOR and OR are the same;
# - `Inbox::returns_pending -> true`: a hint that lets a receiver skip
#   taking the hand-back lock; always true only takes it every time (the
#   hand-backs are read under the lock whatever the hint says).
# Timeouts are mutants that make a test wait for good (a credit or a
# doorbell never given back): caught, by the timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
files=(--file transport/src/mailbox/core.rs --file transport/src/mailbox/reorder.rs)
if [ "$#" -gt 0 ]; then files=("$@"); fi
exec cargo mutants -p ringmail-transport "${files[@]}" --timeout-multiplier 3 -- --lib
