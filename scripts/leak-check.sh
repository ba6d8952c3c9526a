#!/usr/bin/env bash
# Runs every test binary of the workspace under LeakSanitizer (the one in
# gcc's AddressSanitizer runtime, preloaded: it works with the stable
# toolchain and the system allocator Rust uses) and fails on any leak
# report. Needs libasan.so (Debian: libasan8, which gcc pulls in).
set -euo pipefail
cd "$(dirname "$0")/.."
ASAN="$(gcc -print-file-name=libasan.so)"
[ -e "$ASAN" ] || { echo "leak-check: libasan.so not found (apt-get install libasan8)"; exit 1; }
bins=$(cargo test --workspace --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])')
# No binaries means nothing was measured (a failed build, a changed cargo
# message format): that is a failure, never a clean pass.
total=$(printf '%s\n' $bins | grep -c . || true)
if [ "$total" -eq 0 ]; then
  echo "leak-check: no test binaries found"; exit 1
fi
fail=0
ran=0
skipped=0
for b in $bins; do
  case "$(basename "$b")" in
    # Its children are iproute2's ip, which leaks by design (and is not ours).
    partition-*) echo "leak-check: $(basename "$b") not run here (spawns ip; run by the test suite)"
                 skipped=$((skipped + 1)); continue ;;
  esac
  ran=$((ran + 1))
  log="$(mktemp)"
  # Leaks only: no other ASan checks apply to an uninstrumented binary.
  if ! LD_PRELOAD="$ASAN" ASAN_OPTIONS=detect_leaks=1:exitcode=23:verify_asan_link_order=0 \
       RUST_TEST_THREADS=1 "$b" -q >"$log" 2>&1; then
    echo "leak-check: $(basename "$b") FAILED"
    # The panic lines first (a child process's message can be far above the tail).
    grep -n -A2 "panicked at" "$log" | head -40 || true
    tail -40 "$log"; fail=1
  elif grep -q "LeakSanitizer" "$log"; then
    echo "leak-check: $(basename "$b") reported leaks"; grep -A30 "LeakSanitizer" "$log" | head -60; fail=1
  else
    echo "leak-check: $(basename "$b") clean"
  fi
  rm -f "$log"
done
echo "leak-check: ran $ran of $total test binaries ($skipped skipped)"
if [ "$ran" -eq 0 ]; then
  echo "leak-check: no test binaries were run"; exit 1
fi
exit $fail
