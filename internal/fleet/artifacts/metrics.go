package artifacts

import "github.com/prometheus/client_golang/prometheus"

// metrics are the prefetcher's counters, shared by its parts: the fetch
// and the blob writers count bytes, the download counts blobs, failures
// and resumes, retention counts removals.
type metrics struct {
	bytes    prometheus.Counter
	blobs    prometheus.Counter
	failures *prometheus.CounterVec
	curBytes *prometheus.GaugeVec
	curTotal *prometheus.GaugeVec
	unlinked prometheus.Counter
	resumed  prometheus.Counter
}

// newMetrics returns the metrics, registered with reg unless it is nil.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		bytes:    prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_artifact_download_bytes_total", Help: "Bytes downloaded by the artifact prefetcher."}),
		blobs:    prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_artifact_blobs_stored_total", Help: "Verified blobs stored by the artifact prefetcher."}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_artifact_download_failures_total", Help: "Failed artifact downloads by reason."}, []string{"reason"}),
		curBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_artifact_download_progress_bytes", Help: "Bytes downloaded so far of a running download."}, []string{"digest"}),
		curTotal: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "myriarch_artifact_download_size_bytes", Help: "Size of a running download (-1 unknown)."}, []string{"digest"}),
		unlinked: prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_artifact_blobs_removed_total", Help: "Blobs removed by the retention of the artifact prefetcher."}),
		resumed:  prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_artifact_downloads_resumed_total", Help: "Downloads continued from the bytes a previous attempt committed (PostgreSQL segments or S3 parts)."}),
	}
	if reg != nil {
		reg.MustRegister(m.bytes, m.blobs, m.failures, m.curBytes, m.curTotal, m.unlinked, m.resumed)
	}
	return m
}
