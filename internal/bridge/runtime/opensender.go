package runtime

import (
	"log/slog"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// OpenSender opens one configured sender outside a running bridge, as the
// bridge would (`myriarch-bridge deadletter replay`). instanceID stands
// for the bridge's instance id where a sender derives a name from it (the
// MQTT client id: client_id-instanceID), so a distinct one keeps the
// command from taking over a running bridge's connection.
func OpenSender(s config.SenderSettings, instanceID string, log *slog.Logger) (sender.Sender, error) {
	return openSender(s, instanceID, log)
}
