#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets) for SECS seconds each
# (default 20): the frame decoder, the segment opener, the handshake state
# machine and the KV server's RESP parser. libFuzzer needs the compiler's
# unstable sanitizer flags; the stable toolchain provides them with
# RUSTC_BOOTSTRAP=1 (no other toolchain is needed). A crash fails the run and
# leaves its input in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECS="${1:-20}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O
for t in frame_decode segment_open handshake resp_parse; do
  echo "== fuzz $t for ${SECS}s"
  log="$(mktemp)"
  rc=0
  cargo fuzz run -O "$t" -- -max_total_time="$SECS" >"$log" 2>&1 || rc=$?
  grep -E "^Done|ERROR|panicked" "$log" || true
  if [ "$rc" -ne 0 ]; then
    tail -40 "$log"; echo "fuzz: $t failed (exit $rc; see fuzz/artifacts/$t)"; exit 1
  fi
  rm -f "$log"
done
