// Package activation owns the post-takeover activation bounds that the
// bridge's transports declare to the failover budgets: the defaults of the
// steps and the one formula per transport. Bridge config validation, the
// MQTT transport, the budget command and the docs generator all call it, so
// the bound has one source.
//
// It is a leaf package (it imports only failover), so that the budget
// command and the docs generator do not link the MQTT client.
package activation

import (
	"time"

	"github.com/myriarch/myriarch/failover"
)

// Defaults of the MQTT transport's activation steps (the sessions block's
// connect_timeout, reconcile_timeout and unmatched_grace).
const (
	DefaultMQTTConnectTimeout   = 30 * time.Second
	DefaultMQTTReconcileTimeout = 30 * time.Second
	DefaultMQTTUnmatchedGrace   = 30 * time.Second
)

// MQTT is the activation bound of the MQTT transport:
// 2·connect_timeout + 4·reconcile_timeout + 2·unmatched_grace (240s at the
// defaults). The transport enforces each step with its own timeout; every
// one must be positive. Errors name the config key of the step.
func MQTT(connectTimeout, reconcileTimeout, unmatchedGrace time.Duration) (failover.Activation, error) {
	return failover.DeclareActivation("mqtt",
		failover.ActivationStep{Name: "connect_timeout", Times: 2, Timeout: connectTimeout},
		failover.ActivationStep{Name: "reconcile_timeout", Times: 4, Timeout: reconcileTimeout},
		failover.ActivationStep{Name: "unmatched_grace", Times: 2, Timeout: unmatchedGrace},
	)
}

// DefaultMQTT is MQTT at the default timeouts.
func DefaultMQTT() failover.Activation {
	a, err := MQTT(DefaultMQTTConnectTimeout, DefaultMQTTReconcileTimeout, DefaultMQTTUnmatchedGrace)
	if err != nil {
		panic("activation: the MQTT defaults are refused: " + err.Error())
	}
	return a
}
