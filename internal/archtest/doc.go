// Package archtest holds the architecture rules of the module as tests:
// what docs/architecture.md states about layers, the two daemons, the
// production binaries and the owners of tables fails `make test` when
// the code breaks it. The rules run on data (the package graph that `go
// list` reports, the SQL in the source), so each rule is also shown to
// fail on a planted violation.
package archtest
