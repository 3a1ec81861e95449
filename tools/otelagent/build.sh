#!/usr/bin/env bash
# Builds the real agent used by the OpAMP integration test: the
# OpenTelemetry OpAMP supervisor and a small collector (OTLP receiver, debug
# exporter, OpAMP extension). Both are slow to build (about 100 s for the
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

if [ ! -x "$dir/bin/opampsupervisor" ]; then
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
fi

if [ ! -x "$dir/bin/otelcol-myriarch" ]; then
  start=$(date +%s)
  if [ ! -x "$dir/bin/builder" ]; then
    GOBIN="$dir/bin" $GO install go.opentelemetry.io/collector/cmd/builder@v$VERSION
  fi
  sed -e "s|@VERSION@|$VERSION|g" -e "s|@PROVIDERS@|$PROVIDERS|g" -e "s|@OUT@|$dir/src/collector|g" \
    "$here/builder-config.yaml" >"$dir/builder-config.yaml"
  "$dir/bin/builder" --config "$dir/builder-config.yaml"
  cp "$dir/src/collector/otelcol-myriarch" "$dir/bin/otelcol-myriarch.tmp"
  mv "$dir/bin/otelcol-myriarch.tmp" "$dir/bin/otelcol-myriarch"
  echo "otelagent: built otelcol-myriarch v$VERSION in $(( $(date +%s) - start )) s"
fi
echo "otelagent: binaries in $dir/bin"
