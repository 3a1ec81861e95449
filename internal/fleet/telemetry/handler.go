package telemetry

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
)

// Receiver answers the OTLP/HTTP metrics requests of agents.
type Receiver struct {
	Batcher *Batcher
}

// ServeAgent answers one OTLP/HTTP export request of agent uid: the
// caller has authenticated the agent by its own credential and bounded
// the body. The series are stored under uid whatever the request says
// about its sender (resource attributes name no one here): an agent can
// only write its own series. The answer is an empty
// ExportMetricsServiceResponse in the request's encoding; a body that
// does not decode is refused with 400 and not retried by OTLP exporters.
func (rc *Receiver) ServeAgent(w http.ResponseWriter, r *http.Request, uid string) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method "+r.Method+": the OTLP/HTTP metrics endpoint takes POST", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			http.Error(w, "body larger than "+strconv.FormatInt(mbe.Limit, 10)+" bytes (server.opampMaxMessageBytes)", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	samples, isJSON, err := Decode(body, r.Header.Get("Content-Type"))
	if errors.Is(err, ErrContentType) {
		http.Error(w, err.Error(), http.StatusUnsupportedMediaType)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.Batcher.Add(uid, samples)
	resp := pmetricotlp.NewExportResponse()
	var out []byte
	if isJSON {
		out, err = resp.MarshalJSON()
		w.Header().Set("Content-Type", "application/json")
	} else {
		out, err = resp.MarshalProto()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}
