#!/usr/bin/env bash
# The KV server driven by Python's `redis` package (redis-py, from PyPI) at
# its default settings: starts `kv` with 3 workers, runs
# scripts/kv-python.py against it, stops it with SIGTERM and checks a clean
# exit. redis-py is installed into a virtualenv under target/ on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/pyenv
if ! "$venv/bin/python" -c 'import redis' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'redis>=5'
fi
# A port below the ephemeral range that nothing listens on.
PORT="$(python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(1000):
    p = random.randrange(max(1024, low // 2), low)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); print(p); break
    except OSError:
        pass
    finally:
        s.close()
PY
)"
cargo build --release -q -p ringmail-examples --bin kv
log="$(mktemp)"
target/release/kv --port "$PORT" --workers 3 >"$log" 2>&1 &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 100); do
  grep -q listening "$log" && break
  sleep 0.1
done
if ! timeout 300 "$venv/bin/python" scripts/kv-python.py "$PORT"; then
  echo "kv-python: the server's output:"; cat "$log"; exit 1
fi
kill -TERM "$pid"
for _ in $(seq 1 100); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
grep -q "kv: stopped" "$log" || { echo "kv-python: no clean stop"; cat "$log"; exit 1; }
echo "kv-python: clean stop"
