// Package deploy holds no code: its tests keep the Helm charts, the systemd
// units and the Prometheus rule files in line with the numbers the Go code
// derives, and run the real tools (helm, promtool) over them.
//
// The rule files in prometheus/ are the charts' PrometheusRules rendered
// for a plain Prometheus (series selected by job); regenerate them with
// `go generate ./deploy` (or `make docs`), a test fails when they drift.
package deploy

//go:generate go test -run ^TestRuleFilesAreCurrent$ -update .
