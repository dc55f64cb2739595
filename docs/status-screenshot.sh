#!/usr/bin/env bash
# Takes docs/status.png: the master's status page, shot with headless Chromium in the middle of a
# churn run on this machine (five peers over three sites; one SIGKILLed and replaced, one stopped for
# 3 s and kicked, one more killed and replaced). Needs chromium (Debian's package). Only processes
# this script started are ended, by their ids.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/status.png}
bin=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	rm -rf "$bin"
}
trap cleanup EXIT
go build -o "$bin/master" ./cmd/master
go build -o "$bin/peer" ./cmd/peer
"$bin/master" --listen 127.0.0.1:48148 --http 127.0.0.1:48180 --log-level warn &
pids+=($!)
sleep 1
start() {
	"$bin/peer" run --master 127.0.0.1:48148 --listen 127.0.0.1:0 --site "$1" --size 4194304 --steps 100000 >/dev/null 2>&1 &
	pids+=($!)
}
start eu; start eu; start us; start us; start ap
sleep 8
kill -9 "${pids[2]}"; sleep 3; start eu
sleep 6
kill -STOP "${pids[4]}"; sleep 3; kill -CONT "${pids[4]}"
sleep 4
kill -9 "${pids[5]}"; sleep 1; start ap
sleep 5
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1480 \
	--screenshot="$out" http://127.0.0.1:48180/ 2>/dev/null
echo "wrote $out"
