package deadletter_test

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/myriarch/myriarch/internal/bridge/deadletter"
)

// FuzzDecode: Decode never panics, and what it accepts encodes to a line
// that decodes to the same record (the id included).
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"id":"0123456789abcdef","time":"2026-01-02T03:04:05.000000006+01:00","route":"r","sender":"s","topic":"t","source_topic":"in/t","qos":2,"retain":true,"received":"2026-01-02T03:04:05Z","payload":"AAEC","properties":{"user":[{"key":"k","value":"v"}],"payload_format":1,"message_expiry":5,"correlation_data":"AQ=="},"lease_version":7,"session_id":"b/s","attempts":5,"reason":"x"}`))
	f.Add([]byte(`{"time":"2026-01-02T03:04:05Z","route":"r","sender":"s","topic":"t","qos":1,"payload":null,"attempts":1,"reason":""}`))
	f.Add([]byte(`{"time":"2026-01-02T03:04:05Z","route":"r","sender":"s","topic":"\u001b[2J","payload":"","attempts":0,"reason":"\ud800"} `))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"id":"x"`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := deadletter.Decode(line)
		if err != nil {
			return
		}
		if !deadletter.ValidID(r.ID) {
			t.Fatalf("accepted id %q", r.ID)
		}
		b, err := deadletter.Encode(&r)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		if bytes.ContainsRune(b, '\n') {
			t.Fatalf("encoded record spans lines: %q", b)
		}
		r2, err := deadletter.Decode(b)
		if err != nil {
			t.Fatalf("re-decode of %q: %v", b, err)
		}
		if !r.Time.Equal(r2.Time) || !r.Received.Equal(r2.Received) {
			t.Fatalf("times differ: %v %v", r, r2)
		}
		r.Time, r.Received = r2.Time, r2.Received
		if !reflect.DeepEqual(r, r2) {
			t.Fatalf("round trip:\n%+v\n%+v", r, r2)
		}
	})
}
