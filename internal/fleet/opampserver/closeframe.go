package opampserver

import (
	"reflect"
	"time"
	"unsafe"

	"github.com/gorilla/websocket"
	"github.com/open-telemetry/opamp-go/server/types"
)

// closeFrameWait bounds the write of a close frame to one agent.
const closeFrameWait = time.Second

// wsConnOf returns the gorilla WebSocket under an opamp-go server
// connection, or nil. opamp-go v0.23's Connection.Disconnect closes the
// socket without a close frame, so agents see an abnormal closure (1006)
// on a planned stop and log it as an error; the close frame needs the
// *websocket.Conn, which opamp-go keeps in an unexported field. A test
// (TestStopSendsCloseFrame) pins this to the opamp-go version in go.mod.
func wsConnOf(c types.Connection) *websocket.Conn {
	v := reflect.ValueOf(c)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	f := v.Elem().FieldByName("wsConn")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*websocket.Conn]() || !f.CanAddr() {
		return nil
	}
	return *(**websocket.Conn)(unsafe.Pointer(f.UnsafeAddr()))
}

// closeGoingAway tells a WebSocket agent that this replica is going away
// (close code 1001), then closes the connection. gorilla's WriteControl
// may run concurrently with opamp-go's own writes.
func closeGoingAway(c types.Connection) {
	if ws := wsConnOf(c); ws != nil {
		_ = ws.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseGoingAway, "myriarchd replica stopping"), time.Now().Add(closeFrameWait))
	}
	_ = c.Disconnect()
}
