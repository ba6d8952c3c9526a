#!/usr/bin/env bash
# Smoke check of the README's main job with the real redis-cli: starts the
# KV server, talks to it, stops it with SIGTERM and checks a clean exit.
# Needs redis-cli (Debian: redis-tools); .ci/run installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-6399}"
command -v redis-cli >/dev/null || { echo "kv-smoke: redis-cli is missing (apt-get install redis-tools)"; exit 1; }

cargo build --release -q -p ringmail-examples --bin kv
log="$(mktemp)"
target/release/kv --port "$PORT" --workers 2 >"$log" 2>&1 &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -f "$log"' EXIT

for _ in $(seq 1 100); do
  redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
cli() { redis-cli -p "$PORT" "$@"; }
expect() { # expect WANT -- command...
  local want="$1"; shift
  local got; got="$(cli "$@")"
  if [ "$got" != "$want" ]; then echo "kv-smoke: '$*' gave '$got', wanted '$want'"; cat "$log"; exit 1; fi
  echo "kv-smoke: $* -> $got"
}
expect PONG ping
expect OK set greeting "hello ringmail"
expect "hello ringmail" get greeting
expect 1 incr visits
expect 11 incrby visits 10
expect OK mset a 1 b 2 c 3
expect "$(printf '1\n2\n3\n')" mget a b c
expect 2 del a b
expect 3 dbsize
redis-cli -p "$PORT" --pipe <<<"$(printf 'SET p%d %d\r\n' $(seq 1 1000 | awk '{print $1, $1}'))" >/dev/null
expect 1003 dbsize
expect OK flushall
expect 0 dbsize

kill -TERM "$pid"
for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then echo "kv-smoke: no exit 10 s after SIGTERM"; cat "$log"; exit 1; fi
wait "$pid"; rc=$?
cat "$log"
grep -q "kv: stopped" "$log" || { echo "kv-smoke: no clean stop"; exit 1; }
echo "kv-smoke: ok (exit $rc)"
