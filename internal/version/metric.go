package version

import "github.com/prometheus/client_golang/prometheus"

// MetricBuildInfo is 1, with the build in its labels, so that dashboards
// can count replicas by version.
const MetricBuildInfo = "myriarch_build_info"

// Collector returns the myriarch_build_info gauge of program at version
// (labels program, version, revision, go_version).
func Collector(program, version string) prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricBuildInfo,
		Help:        "Always 1; the labels name the build of this process.",
		ConstLabels: prometheus.Labels{"program": program, "version": version, "revision": i.Revision, "go_version": i.GoVersion}})
	g.Set(1)
	return g
}
