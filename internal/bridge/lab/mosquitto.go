package lab

import (
	"context"
	"fmt"

	"github.com/myriarch/myriarch/internal/bridge/embroker"
)

// ErrNoMosquitto reports that no mosquitto binary was found.
var ErrNoMosquitto = embroker.ErrNoMosquitto

// MosquittoDefaultMaxQueued is mosquitto 2.0's default max_queued_messages:
// beyond it, messages for an offline persistent session are dropped
// silently.
const MosquittoDefaultMaxQueued = 1000

// Mosquitto is a mosquitto broker on a loopback port.
type Mosquitto struct {
	*embroker.Mosquitto
	// URL is tcp://127.0.0.1:port.
	URL string
}

// MosquittoPath finds the mosquitto binary on $PATH or in /usr/sbin, where
// Debian installs it.
func MosquittoPath() (string, error) { return embroker.MosquittoPath() }

// StartMosquitto starts mosquitto with its config and log in dir.
// maxQueued is written as max_queued_messages; negative keeps mosquitto's
// default (1000), so that the run shows what a default broker does.
// max_inflight_messages stays at its default too.
func StartMosquitto(ctx context.Context, dir string, maxQueued int) (*Mosquitto, error) {
	settings := "persistence false\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\nset_tcp_nodelay true\n"
	if maxQueued >= 0 {
		settings += fmt.Sprintf("max_queued_messages %d\n", maxQueued)
	}
	m, err := embroker.StartMosquittoWith(ctx, dir, settings, "allow_anonymous true\n")
	if err != nil {
		return nil, err
	}
	return &Mosquitto{Mosquitto: m, URL: "tcp://" + m.Addr}, nil
}
