#!/usr/bin/env bash
# The KV server driven by Python's `redis` package (redis-py, from PyPI) at
# its default settings: starts `kv` with 3 workers, and a second one with
# --requirepass for the AUTH checks, runs scripts/kv-python.py against them,
# stops the first with SIGTERM and checks a clean exit. redis-py is
# installed into a virtualenv under target/ on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/pyenv
if ! "$venv/bin/python" -c 'import redis' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'redis>=5'
fi
# Two ports below the ephemeral range that nothing listens on.
read -r PORT AUTH_PORT < <(python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
found = []
for _ in range(1000):
    p = random.randrange(max(1024, low // 2), low)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        if p not in found:
            found.append(p)
    except OSError:
        pass
    finally:
        s.close()
    if len(found) == 2:
        break
print(*found)
PY
)
PASSWORD="py-$RANDOM-$RANDOM"
cargo build --release -q -p ringmail-examples --bin kv
log="$(mktemp)"
auth_log="$(mktemp)"
target/release/kv --port "$PORT" --workers 3 >"$log" 2>&1 &
pid=$!
target/release/kv --port "$AUTH_PORT" --workers 1 --requirepass "$PASSWORD" >"$auth_log" 2>&1 &
auth_pid=$!
trap 'kill -9 $pid $auth_pid 2>/dev/null || true; rm -f "$log" "$auth_log"' EXIT
for _ in $(seq 1 100); do
  grep -q listening "$log" && grep -q listening "$auth_log" && break
  sleep 0.1
done
if ! timeout 300 "$venv/bin/python" scripts/kv-python.py "$PORT" "$AUTH_PORT" "$PASSWORD"; then
  echo "kv-python: the server's output:"; cat "$log"
  echo "kv-python: the password server's output:"; cat "$auth_log"; exit 1
fi
kill -TERM "$auth_pid"
kill -TERM "$pid"
for _ in $(seq 1 100); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
grep -q "kv: stopped" "$log" || { echo "kv-python: no clean stop"; cat "$log"; exit 1; }
echo "kv-python: clean stop"
