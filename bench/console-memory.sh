#!/usr/bin/env bash
# What the web console costs the server (issue 27): its peak resident memory (VmHWM) after a
# backup and a minute of work, without the console and with it while a headless Chromium
# keeps the activity page open (it polls every second) and then walks every page.
#   bench/console-memory.sh [SECONDS]      (default 60; needs chromium and chromium-driver)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_OPEN=${1:-60}
# QSM=path/to/qsm to measure a binary already built (the figures in docs/PERFORMANCE.md are of
# the release build).
if [ -z "${QSM:-}" ]; then
  cargo build --release -p qsm >/dev/null
  QSM=$PWD/target/release/qsm
fi
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT

run() { # $1: label, $2...: extra server flags
  local label=$1; shift
  local data=$WORK/$label
  mkdir -p "$data"
  "$QSM" server --data-dir "$data" --listen 127.0.0.1:0 "$@" >"$WORK/$label.out" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do grep -q "listening on https" "$WORK/$label.out" 2>/dev/null && break; sleep 0.1; done
  local grpc; grpc=$(grep -o 'https://[0-9.:]*' "$WORK/$label.out" | head -1)
  local console; console=$(sed -n 's/.*web console and API on //p' "$WORK/$label.out")
  echo 'admin-password' | "$QSM" admin --server "unix:$data/qsm.sock" register-admin ops --privilege system >/dev/null
  echo 'alpha-password' | "$QSM" admin --server "unix:$data/qsm.sock" register-node alpha >/dev/null
  echo 'alpha-password' > "$WORK/pw"; chmod 600 "$WORK/pw"
  QSM_SERVER=$grpc QSM_NODE=alpha QSM_PASSWORD_FILE=$WORK/pw QSM_CA=$data/tls/cert.pem \
    QSM_HOME=$WORK/home "$QSM" backup crates >/dev/null
  if [ -n "$console" ]; then
    python3 - "$console" "$SECONDS_OPEN" <<'PY'
import json, socket, subprocess, sys, time, urllib.request
console, seconds = sys.argv[1], int(sys.argv[2])
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
driver = subprocess.Popen(["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
base = f"http://127.0.0.1:{port}"
def wd(method, path, body=None):
    req = urllib.request.Request(base + path, method=method,
        data=None if body is None else json.dumps(body).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req))["value"]
for _ in range(100):
    try: wd("GET", "/status"); break
    except Exception: time.sleep(0.1)
caps = {"capabilities": {"alwaysMatch": {"acceptInsecureCerts": True, "goog:chromeOptions": {
    "binary": "/usr/bin/chromium", "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]}}}}
sid = wd("POST", "/session", caps)["sessionId"]
js = lambda script: wd("POST", f"/session/{sid}/execute/sync", {"script": script, "args": []})
wd("POST", f"/session/{sid}/url", {"url": console})
time.sleep(1)
js("document.querySelector('#login-name').value='ops'; document.querySelector('#login-password').value='admin-password'; document.querySelector('#login-submit').click();")
time.sleep(1)
wd("POST", f"/session/{sid}/url", {"url": console + "#/activity"})
time.sleep(seconds)
for page in ["", "nodes", "nodes/alpha", "events", "actlog", "storage", "policy"]:
    wd("POST", f"/session/{sid}/url", {"url": console + "#/" + page}); time.sleep(1)
wd("DELETE", f"/session/{sid}")
driver.kill()
PY
  else
    sleep "$SECONDS_OPEN"
  fi
  local hwm rss
  hwm=$(awk '/VmHWM/ {print $2}' /proc/$pid/status); rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
  echo "$label: peak $((hwm / 1024)) MB, now $((rss / 1024)) MB"
  kill $pid; wait $pid 2>/dev/null || true
}
run without
run with --http-listen 127.0.0.1:0
