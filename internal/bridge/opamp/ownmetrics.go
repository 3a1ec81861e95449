package opamp

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
)

// Own metrics
//
// The bridge declares ReportsOwnMetrics when it has a metrics registry
// (Options.Gatherer). When myriarchd offers a destination
// (ConnectionSettingsOffers.own_metrics: an OTLP/HTTP URL and headers
// carrying the agent's credential), the bridge sends every
// Options.OwnMetricsInterval (default 10 s) an OTLP/HTTP protobuf export
// of the series an operator needs, built from its registry:
//
//   - per route: myriarch_bridge_messages_in, _out (summed over the
//     route's senders) and _dead_lettered as cumulative sums, and
//     myriarch_bridge_messages_in_flight as a gauge;
//   - per exclusive session: the failure-to-full of each takeover this
//     instance made since the last send (from the histogram
//     myriarch_bridge_failover_failure_to_full_seconds: the new sum over
//     the new count), and the owner-death budget and failover_slo the
//     session is held to (myriarch_bridge_failover_budget_seconds,
//     myriarch_bridge_failover_slo_seconds), from the budget report.
//
// An offer without a destination stops the sending. A send that fails is
// logged at debug and not retried (the next one carries the cumulative
// values); takeovers are re-sent until a send succeeds.

// DefaultOwnMetricsInterval is how often the bridge sends its own metrics.
const DefaultOwnMetricsInterval = 10 * time.Second

type ownMetrics struct {
	c        *Client
	gather   prometheus.Gatherer
	interval time.Duration
	http     *http.Client

	mu      sync.Mutex
	dest    string
	headers http.Header
	// takeovers already sent: count and sum of the histogram per session.
	sentCount map[string]uint64
	sentSum   map[string]float64
	sends     int
}

func newOwnMetrics(c *Client, g prometheus.Gatherer, interval time.Duration, tc *tls.Config) *ownMetrics {
	if interval <= 0 {
		interval = DefaultOwnMetricsInterval
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &ownMetrics{c: c, gather: g, interval: interval, http: &http.Client{Timeout: 10 * time.Second, Transport: tr},
		sentCount: map[string]uint64{}, sentSum: map[string]float64{}}
}

// onConnectionSettings takes the own_metrics destination of an offer.
func (m *ownMetrics) onConnectionSettings(_ context.Context, s *protobufs.ConnectionSettingsOffers) error {
	om := s.GetOwnMetrics()
	if om == nil {
		return nil
	}
	dest := om.GetDestinationEndpoint()
	if dest != "" && !strings.HasPrefix(dest, "http://") && !strings.HasPrefix(dest, "https://") {
		return fmt.Errorf("own_metrics destination %q: must be an http:// or https:// URL", dest)
	}
	// The headers carry the agent's credential: not in clear text to a
	// plain http:// destination when OpAMP itself runs over TLS (a
	// telemetry.publicUrl written with http://).
	if st := m.c.o.Settings; st != nil && strings.HasPrefix(dest, "http://") && (strings.HasPrefix(st.ServerURL, "wss://") || strings.HasPrefix(st.ServerURL, "https://")) {
		su := st.ServerURL
		err := fmt.Errorf("own_metrics destination %q: plain http:// while opamp.server_url %q uses TLS; the credential is not sent in clear text (set myriarchd's telemetry.publicUrl to an https:// URL)", dest, su)
		m.c.log.Warn("own metrics not sent", "err", err)
		return err
	}
	h := http.Header{}
	for _, kv := range om.GetHeaders().GetHeaders() {
		h.Add(kv.Key, kv.Value)
	}
	m.mu.Lock()
	changed := m.dest != dest
	m.dest, m.headers = dest, h
	m.mu.Unlock()
	if changed {
		m.c.log.Info("sending own metrics to myriarchd", "url", dest, "interval", m.interval)
	}
	return nil
}

// Sends is how many exports succeeded (tests).
func (m *ownMetrics) Sends() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sends
}

func (m *ownMetrics) run() {
	defer m.c.wg.Done()
	t := time.NewTicker(m.interval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-m.c.stop:
			return
		case <-t.C:
			if err := m.send(ctx); err != nil && ctx.Err() == nil {
				m.c.log.Debug("sending own metrics", "err", err)
			}
		}
	}
}

// send builds and posts one export; nothing when no destination is set.
func (m *ownMetrics) send(ctx context.Context) error {
	m.mu.Lock()
	dest, headers := m.dest, m.headers.Clone()
	m.mu.Unlock()
	if dest == "" {
		return nil
	}
	md, counts, sums, err := m.build()
	if err != nil {
		return err
	}
	body, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dest, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, v := range headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := m.http.Do(req)
	if err != nil {
		return err
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s: %s", dest, resp.Status, bytes.TrimSpace(msg))
	}
	m.mu.Lock()
	m.sentCount, m.sentSum = counts, sums
	m.sends++
	m.mu.Unlock()
	return nil
}

// build turns the registry and the budget report into OTLP metrics; it
// returns the takeover histograms' counts and sums it covered.
func (m *ownMetrics) build() (pmetric.Metrics, map[string]uint64, map[string]float64, error) {
	fams, err := m.gather.Gather()
	if err != nil {
		return pmetric.Metrics{}, nil, nil, err
	}
	now := pcommon.NewTimestampFromTime(time.Now())
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	ra := rm.Resource().Attributes()
	ra.PutStr("service.name", ServiceName)
	ra.PutStr("service.instance.id", m.c.o.InstanceID)
	ra.PutStr("myriarch.bridge.id", m.c.o.BridgeID)
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName("github.com/myriarch/myriarch/internal/bridge/opamp")
	ms := sm.Metrics()
	perLabel := func(f *dto.MetricFamily, label string, val func(*dto.Metric) float64) map[string]float64 {
		out := map[string]float64{}
		for _, x := range f.GetMetric() {
			for _, l := range x.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] += val(x)
				}
			}
		}
		return out
	}
	counter := func(x *dto.Metric) float64 { return x.GetCounter().GetValue() }
	gauge := func(x *dto.Metric) float64 { return x.GetGauge().GetValue() }
	addSum := func(name, label string, vals map[string]float64) {
		if len(vals) == 0 {
			return
		}
		mt := ms.AppendEmpty()
		mt.SetName(name)
		s := mt.SetEmptySum()
		s.SetIsMonotonic(true)
		s.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		for k, v := range vals {
			dp := s.DataPoints().AppendEmpty()
			dp.SetTimestamp(now)
			dp.SetDoubleValue(v)
			dp.Attributes().PutStr(label, k)
		}
	}
	addGauge := func(name, unit, label string, vals map[string]float64) {
		if len(vals) == 0 {
			return
		}
		mt := ms.AppendEmpty()
		mt.SetName(name)
		mt.SetUnit(unit)
		g := mt.SetEmptyGauge()
		for k, v := range vals {
			dp := g.DataPoints().AppendEmpty()
			dp.SetTimestamp(now)
			dp.SetDoubleValue(v)
			dp.Attributes().PutStr(label, k)
		}
	}
	m.mu.Lock()
	prevCount, prevSum := m.sentCount, m.sentSum
	m.mu.Unlock()
	counts, sums := map[string]uint64{}, map[string]float64{}
	takeovers := map[string]float64{}
	for _, f := range fams {
		switch f.GetName() {
		case "myriarch_bridge_messages_in_total":
			addSum("myriarch_bridge_messages_in", "route", perLabel(f, "route", counter))
		case "myriarch_bridge_messages_out_total":
			addSum("myriarch_bridge_messages_out", "route", perLabel(f, "route", counter))
		case "myriarch_bridge_messages_dead_lettered_total":
			addSum("myriarch_bridge_messages_dead_lettered", "route", perLabel(f, "route", counter))
		case "myriarch_bridge_messages_in_flight":
			addGauge("myriarch_bridge_messages_in_flight", "{message}", "route", perLabel(f, "route", gauge))
		case "myriarch_bridge_failover_failure_to_full_seconds":
			for _, x := range f.GetMetric() {
				sess := ""
				for _, l := range x.GetLabel() {
					if l.GetName() == "session" {
						sess = l.GetValue()
					}
				}
				h := x.GetHistogram()
				counts[sess], sums[sess] = h.GetSampleCount(), h.GetSampleSum()
				if n := h.GetSampleCount() - prevCount[sess]; h.GetSampleCount() > prevCount[sess] {
					takeovers[sess] = (h.GetSampleSum() - prevSum[sess]) / float64(n)
				}
			}
		}
	}
	addGauge("myriarch_bridge_failover_failure_to_full_seconds", "s", "session", takeovers)
	budgets, slos := map[string]float64{}, map[string]float64{}
	for _, s := range m.c.o.Bridge.Status().Sessions {
		if s.Budget == nil {
			continue
		}
		if b := s.Budget.OwnerDeathBudget; b != nil {
			budgets[s.ID] = *b
		}
		if v := s.Budget.FailoverSLO; v != nil {
			slos[s.ID] = *v
		}
	}
	addGauge("myriarch_bridge_failover_budget_seconds", "s", "session", budgets)
	addGauge("myriarch_bridge_failover_slo_seconds", "s", "session", slos)
	return md, counts, sums, nil
}
