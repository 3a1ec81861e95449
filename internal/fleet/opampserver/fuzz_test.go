package opampserver

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"google.golang.org/protobuf/proto"

	"github.com/myriarch/myriarch/internal/fleet/lastseen"
)

// FuzzAgentToServer feeds arbitrary bytes, plain or as gzip, through the
// body limit and into the handling of an AgentToServer (state, events,
// health, config). Run: go test -fuzz FuzzAgentToServer -fuzztime 30s ./internal/fleet/opampserver/
func FuzzAgentToServer(f *testing.F) {
	seeds := []*protobufs.AgentToServer{
		{InstanceUid: make([]byte, 16), Capabilities: 7},
		{InstanceUid: []byte{1, 2, 3}, AgentDescription: &protobufs.AgentDescription{IdentifyingAttributes: []*protobufs.KeyValue{
			{Key: "service.name", Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: "x"}}},
			{Key: "n", Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_IntValue{IntValue: 3}}},
			{Key: "kv", Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_KvlistValue{KvlistValue: &protobufs.KeyValueList{}}}},
			{Key: "nil"}}}},
		{InstanceUid: make([]byte, 16), Health: &protobufs.ComponentHealth{Healthy: false, LastError: "e",
			ComponentHealthMap: map[string]*protobufs.ComponentHealth{"a": {ComponentHealthMap: map[string]*protobufs.ComponentHealth{"b": nil}}}}},
		{InstanceUid: make([]byte, 16), RemoteConfigStatus: &protobufs.RemoteConfigStatus{Status: protobufs.RemoteConfigStatuses_RemoteConfigStatuses_FAILED,
			LastRemoteConfigHash: []byte{1}, ErrorMessage: "bad"},
			EffectiveConfig: &protobufs.EffectiveConfig{ConfigMap: &protobufs.AgentConfigMap{ConfigMap: map[string]*protobufs.AgentConfigFile{"a": {Body: []byte("x")}, "b": nil}}},
			PackageStatuses: &protobufs.PackageStatuses{Packages: map[string]*protobufs.PackageStatus{"p": nil, "q": {Name: "q"}}}},
	}
	for _, m := range seeds {
		b, _ := proto.Marshal(m)
		f.Add(b, false)
		f.Add(b, true)
	}
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0}, false)
	const max = 64 << 10
	s := New(Options{Batcher: lastseen.New(nil, time.Hour, nil, nil), ReplicaID: "r", MaxMessageBytes: max, Secret: "fuzz-enrollment-secret"})
	f.Fuzz(func(t *testing.T, data []byte, gz bool) {
		var parsed *protobufs.AgentToServer
		h := s.guard.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			if err != nil || len(b) > max {
				t.Fatalf("the limit let %d bytes through (%v)", len(b), err)
			}
			var m protobufs.AgentToServer
			if proto.Unmarshal(b, &m) == nil {
				parsed = &m
			}
		}))
		body := data
		if gz {
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			zw.Write(data)
			zw.Close()
			body = buf.Bytes()
		}
		req := httptest.NewRequest("POST", "/v1/opamp", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer fuzz-enrollment-secret")
		if gz {
			req.Header.Set("Content-Encoding", "gzip")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if parsed == nil {
			return
		}
		var rep reported
		uid := UID(parsed.InstanceUid)
		if b, err := ParseUID(uid); err != nil || !bytes.Equal(b, parsed.InstanceUid) {
			t.Fatalf("UID round trip: %q %v", uid, err)
		}
		s.state(uid, parsed, time.Now(), &rep)
		s.state(uid, parsed, time.Now(), &rep) // a repeat
	})
}
