#!/usr/bin/env bash
# The whole Ringmail test suite: unit, integration and doc tests on real
# rings, then the loom models of the mailbox core.
#
# Needs a Linux 6.3+ kernel with io_uring allowed for this process; when it
# is not, the tests fail with Ringmail's own error naming the cause (they
# are never skipped).
#
#   LOOM_MAX_PREEMPTIONS=3 scripts/test-all.sh   # deeper model checking (about 1 min)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace"
cargo test --workspace

echo "== the KV with Python's redis client (redis-py from PyPI, default settings)"
scripts/kv-python.sh

echo "== the actor crate's layers (runtime/ below actor/, no import cycle outside actor/)"
python3 scripts/check_layers.py

echo "== the book's links and includes"
python3 scripts/check_book.py

echo "== loom models of the mailbox core, the actors' park/wake handshake and the wire's credit drain (LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2})"
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" RUSTFLAGS="--cfg loom" \
  cargo test -p ringmail-transport -p ringmail --release --lib --target-dir target/loom -- loom
