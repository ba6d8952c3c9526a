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
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
files=(--file transport/src/mailbox/core.rs --file transport/src/mailbox/reorder.rs)
if [ "$#" -gt 0 ]; then files=("$@"); fi
exec cargo mutants -p ringmail-transport "${files[@]}" --timeout-multiplier 3 -- --lib
