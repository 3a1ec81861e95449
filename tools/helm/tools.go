//go:build tools

// Package helm pins the helm CLI that the chart tests run. It is a module of
// its own so that helm's Kubernetes dependencies stay out of the main module.
package helm

import _ "helm.sh/helm/v3/cmd/helm"
