package pgtest

import (
	"testing"

	"go.uber.org/goleak"
)

// The fault proxy starts goroutines; every one must be stopped by Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
