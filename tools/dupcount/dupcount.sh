#!/bin/sh
# dupcount.sh: the production duplicate pairs of the tree (issue 22's
# measure): the `duplicates` tool over the non-test Go files only, without
# tools/, e2e/, the lab and load binaries, and the test and lab packages.
# Run from anywhere inside the repository; MOST (default 200) bounds the
# rows listed; the last line is the number of pairs.
set -eu
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root"
# Directories whose code is test or lab machinery, not production: the
# lab and load binaries, the benchmarks, and the packages that exist for
# tests (most import "testing"; internal/archtest checks that no
# production binary links them).
excluded='^(tools|e2e|cmd/myriarch-lab|cmd/myriarch-loadagents|internal/pgtest|internal/faultnet|internal/testnet|internal/testpki|internal/bridge/lab|internal/leaderlab|internal/fleet/fleettest|lease/leasetest|lease/etcdtest|lease/internal/leasesim|lease/internal/rowstore/waketest|internal/bridge/bench|internal/archtest|internal/fleet/otelagent|internal/fleet/releases/ocitest|internal/fleet/artifacts/blobstore/s3test|internal/bridge/sender/sendertest|internal/testwait|internal/fleet/api/openapitest|internal/bridge/sender/amqp/amqptest|internal/bridge/sender/sqs/sqstest)/'
git ls-files --cached --others --exclude-standard -- '*.go' |
	grep -v '_test\.go$' | grep -Ev "$excluded" |
	while IFS= read -r f; do
		[ -f "$f" ] || continue
		mkdir -p "$tmp/$(dirname "$f")"
		cp "$f" "$tmp/$f"
	done
cd "$tmp"
git init -q && git add -A && git -c user.name=dupcount -c user.email=dupcount@localhost commit -qm tree
out=$(duplicates --most "${MOST:-200}" --seconds 120)
printf '%s\n' "$out"
# The first line counts the pairs ("N pairs in M files", or "no duplicates").
printf '%s\n' "$out" | head -n 1 | awk '/^no duplicates/ {print 0; exit} {print $1}'
