#!/usr/bin/env bash
# Builds the real agent used by the OpAMP integration test: the
# OpenTelemetry OpAMP supervisor and a small collector (OTLP and nop
# receivers, debug and nop exporters, OpAMP extension). Both are slow to build (about 100 s for the
# collector on 2 cores), so the binaries are cached outside the clone in
# $OTEL_AGENT_DIR (default ~/.cache/myriarch/otel-v$VERSION) and this script
# does nothing when they are already there.
#
# The wrapper modules are generated into the cache directory: they must not
# become part of the main module (their dependency graph is large and the
# supervisor's go.mod has replace directives, so `go install pkg@version`
# is refused and `go mod tidy` fails; `go build -mod=mod` works).
set -euo pipefail
VERSION=0.149.0
PROVIDERS=1.55.0
here="$(cd "$(dirname "$0")" && pwd)"
dir="${OTEL_AGENT_DIR:-$HOME/.cache/myriarch/otel-v$VERSION}"
GO="${GO:-go}"
mkdir -p "$dir/bin"
export GOFLAGS=-mod=mod GOWORK=off

# The supervisor and the collector are built at the same time (their
# module downloads and links overlap; each compile uses every core
# anyway). Each build writes its own log, shown when it ends; the script
# fails when either fails.
supervisor() {
  [ -x "$dir/bin/opampsupervisor" ] && return 0
  local start w
  start=$(date +%s)
  w="$dir/src/supervisor"
  rm -rf "$w" && mkdir -p "$w"
  cat >"$w/go.mod" <<MOD
module myriarch.local/otelagent/supervisor

go 1.26

require github.com/open-telemetry/opentelemetry-collector-contrib/cmd/opampsupervisor v$VERSION
MOD
  (cd "$w" && $GO build -mod=mod -trimpath -o "$dir/bin/opampsupervisor.tmp" \
    github.com/open-telemetry/opentelemetry-collector-contrib/cmd/opampsupervisor)
  mv "$dir/bin/opampsupervisor.tmp" "$dir/bin/opampsupervisor"
  echo "otelagent: built opampsupervisor v$VERSION in $(( $(date +%s) - start )) s"
}

# The collector is rebuilt when its manifest changed since the cached one
# was built (a component added): the manifest it was built from is kept
# next to it and compared.
manifest="$(sed -e "s|@VERSION@|$VERSION|g" -e "s|@PROVIDERS@|$PROVIDERS|g" -e "s|@OUT@|$dir/src/collector|g" \
  "$here/builder-config.yaml")"
collector() {
  [ -x "$dir/bin/otelcol-myriarch" ] && [ "$(cat "$dir/bin/otelcol-myriarch.manifest" 2>/dev/null)" = "$manifest" ] && return 0
  local start
  start=$(date +%s)
  if [ ! -x "$dir/bin/builder" ]; then
    GOBIN="$dir/bin" $GO install go.opentelemetry.io/collector/cmd/builder@v$VERSION
  fi
  printf '%s\n' "$manifest" >"$dir/builder-config.yaml"
  "$dir/bin/builder" --config "$dir/builder-config.yaml"
  cp "$dir/src/collector/otelcol-myriarch" "$dir/bin/otelcol-myriarch.tmp"
  mv "$dir/bin/otelcol-myriarch.tmp" "$dir/bin/otelcol-myriarch"
  printf '%s\n' "$manifest" >"$dir/bin/otelcol-myriarch.manifest"
  echo "otelagent: built otelcol-myriarch v$VERSION in $(( $(date +%s) - start )) s"
}

supervisor >"$dir/supervisor.log" 2>&1 &
sup=$!
collector >"$dir/collector.log" 2>&1 &
col=$!
failed=0
wait "$sup" || { failed=1; echo "otelagent: building opampsupervisor failed:"; }
cat "$dir/supervisor.log"
wait "$col" || { failed=1; echo "otelagent: building otelcol-myriarch failed:"; }
cat "$dir/collector.log"
[ "$failed" = 0 ] || exit 1
echo "otelagent: binaries in $dir/bin"
