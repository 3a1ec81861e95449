#!/usr/bin/env bash
# make demo: build the bridge and the lab, saying what takes the time, then
# run the lab. A first build on a fresh machine compiles every dependency
# (about 720 packages: about 3 minutes on an idle 2-core machine, much longer on a
# loaded one); once Go's build cache has them it takes seconds.
set -euo pipefail
GO=${GO:-go}
cd "$(dirname "$0")/../.."
start=$(date +%s)
echo "==> building bin/myriarch-bridge and bin/myriarch-lab (a first build compiles ~720 packages: minutes on 2 cores; later builds take seconds)"
n=0 status=1
while IFS= read -r line; do
  case "$line" in
    "__status "*) status=${line#__status } ;;
    *.go:*|*error*|*cannot*|*undefined*) echo "$line" ;;  # compiler errors pass through
    *) n=$((n + 1)); if (( n % 25 == 0 )); then echo "    ... $n packages compiled ($(( $(date +%s) - start )) s)"; fi ;;
  esac
done < <("$GO" build -v -o bin/ ./cmd/myriarch-bridge ./cmd/myriarch-lab 2>&1; echo "__status $?")
# The build's status travels on the last line of its output.
if [[ "$status" != 0 ]]; then
  echo "==> build failed" >&2
  exit 1
fi
echo "==> built in $(( $(date +%s) - start )) s ($n packages compiled); running the lab: two bridge processes, an embedded broker and lease store, a QoS 1 publisher; each scenario takes 15-40 s"
exec bin/myriarch-lab bridge "$@"
