package config

import (
	"net/url"
	"time"
)

// OpAMP is the opamp block: the bridge as an agent of myriarchd.
type OpAMP struct {
	// ServerURL is myriarchd's OpAMP endpoint: ws://, wss://, http:// or
	// https://host:port/v1/opamp.
	ServerURL string `yaml:"server_url"`
	// The enrollment secret, presented as a bearer token, read from a
	// file or an environment variable.
	EnrollmentSecretFile string `yaml:"enrollment_secret_file"`
	EnrollmentSecretEnv  string `yaml:"enrollment_secret_env"`
	TLS                  *TLS   `yaml:"tls"`
	// HeartbeatInterval; empty keeps the client's 30s.
	HeartbeatInterval string `yaml:"heartbeat_interval"`
}

// OpAMPSettings is the validated opamp block.
type OpAMPSettings struct {
	ServerURL         string
	EnrollmentSecret  Secret
	TLS               *TLSSettings
	HeartbeatInterval time.Duration // 0: the client's default
}

// opamp validates the opamp block; nil without one.
func (v *validator) opamp(o *OpAMP) *OpAMPSettings {
	if o == nil {
		return nil
	}
	s := &OpAMPSettings{}
	v.resolve("opamp", &opampTable, o, s)
	u, err := url.Parse(o.ServerURL)
	switch {
	case o.ServerURL == "":
	case err != nil || u.Host == "":
		v.add("opamp.server_url", o.ServerURL, "must be a URL such as wss://myriarchd:4320/v1/opamp")
	case u.Scheme != "ws" && u.Scheme != "wss" && u.Scheme != "http" && u.Scheme != "https":
		v.add("opamp.server_url", o.ServerURL, "scheme must be ws, wss, http or https")
	case u.User != nil:
		v.add("opamp.server_url", "[redacted]", "must not hold credentials; use enrollment_secret_file or enrollment_secret_env")
	}
	s.EnrollmentSecret = v.secret("opamp.enrollment_secret", o.EnrollmentSecretFile, o.EnrollmentSecretEnv)
	if o.EnrollmentSecretFile == "" && o.EnrollmentSecretEnv == "" {
		v.add("opamp.enrollment_secret_file", nil, "is required (or enrollment_secret_env): myriarchd refuses agents without the enrollment secret")
	}
	s.TLS = v.tls("opamp.tls", o.TLS)
	if s.TLS != nil && (u == nil || (u.Scheme != "wss" && u.Scheme != "https")) {
		v.add("opamp.tls", nil, "needs a wss:// or https:// server_url")
	}
	return s
}
