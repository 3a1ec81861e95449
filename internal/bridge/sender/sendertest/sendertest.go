// Package sendertest holds the helpers that the tests of every sender
// share: handing a message to a sender and waiting for its one result.
package sendertest

import (
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// ResultLimit bounds the wait for a sender's result; generous because the
// tests run with -race on a loaded machine.
const ResultLimit = 30 * time.Second

// Send hands m to s and returns a channel that receives its result.
func Send(s sender.Sender, m *sender.Message) chan error {
	ch := make(chan error, 1)
	s.Send(m, func(err error) { ch <- err })
	return ch
}

// Result waits for the result on ch and fails the test when none comes
// within ResultLimit.
func Result(t testing.TB, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(ResultLimit):
		t.Fatal("no result from the sender")
		return nil
	}
}

// Eventually polls cond until it holds or limit passes, and reports
// whether it held.
func Eventually(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
