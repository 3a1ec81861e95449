package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/authlimit"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/opampserver"
)

// certReloader serves a certificate from a PEM pair and loads it again
// when either file changes (a renewal by cert-manager or certbot), without
// a restart. A pair that fails to load keeps the previous certificate in
// service and is logged.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string
	checked time.Time
}

// certCheckInterval bounds how often the files are stat'ed.
const certCheckInterval = time.Second

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	c := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *certReloader) fileStamp() string {
	var s string
	for _, f := range []string{c.certFile, c.keyFile} {
		if fi, err := os.Stat(f); err == nil {
			s += fmt.Sprintf("%d/%d;", fi.ModTime().UnixNano(), fi.Size())
		}
	}
	return s
}

// load reads the pair; the caller holds mu or is the constructor.
func (c *certReloader) load() error {
	stamp := c.fileStamp()
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return err
	}
	c.cert, c.stamp = &cert, stamp
	return nil
}

func (c *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= certCheckInterval {
		c.checked = now
		if c.fileStamp() != c.stamp {
			if err := c.load(); err != nil {
				c.log.Error("reloading the TLS certificate failed; the previous one stays in service", "cert", c.certFile, "error", err)
			} else {
				c.log.Info("TLS certificate reloaded", "cert", c.certFile)
			}
		}
	}
	return c.cert, nil
}

// tlsConfig is the TLS configuration of a listener with a reloading
// certificate; nil when certFile is empty (plain TCP).
func tlsConfig(field, certFile, keyFile string, log *slog.Logger) (*tls.Config, error) {
	if certFile == "" {
		return nil, nil
	}
	r, err := newCertReloader(certFile, keyFile, log)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", field, certFile, err)
	}
	return &tls.Config{GetCertificate: r.getCertificate, MinVersion: tls.VersionTLS12}, nil
}

// withClientCAs makes cfg ask for client certificates signed by the CAs
// in file. A client without one still connects (it enrolls with the
// secret or presents its credential); one with a bad one is refused by
// the handshake.
func withClientCAs(cfg *tls.Config, file string) (*tls.Config, error) {
	if file == "" || cfg == nil {
		return cfg, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("server.opampClientCaFile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("server.opampClientCaFile %s: no PEM certificate in it", file)
	}
	cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	return cfg, nil
}

// newHTTPServer is the API/UI server with the configured timeouts and a
// bound on every request body (a handler that reads more gets an error
// and answers 413).
func newHTTPServer(s config.Server, h http.Handler, tlsCfg *tls.Config) *http.Server {
	return &http.Server{
		Handler:           http.MaxBytesHandler(h, s.MaxRequestBytes),
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: s.HTTPReadHeaderTimeout,
		ReadTimeout:       s.HTTPReadTimeout,
		WriteTimeout:      s.HTTPWriteTimeout,
		IdleTimeout:       s.HTTPIdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
}

// listenerLimits are the trusted proxies (both listeners) and the bounds
// of the OpAMP listener from the server.* settings. The list was checked
// by config.Load.
func listenerLimits(s config.Server) (*authlimit.Proxies, opampserver.ListenerLimits) {
	proxies, _ := authlimit.ParseProxies(s.TrustedProxies)
	rate := s.OpAMPBodyMinRate
	if rate == 0 {
		rate = -1 // 0 in the setting: no minimum rate
	}
	return proxies, opampserver.ListenerLimits{Proxies: proxies, AuthFailurePenalty: s.AuthFailurePenalty,
		BodyTimeout: s.OpAMPBodyTimeout, BodyMinRate: rate, BodyBytesInFlight: s.OpAMPBodyBytesInFlight,
		BodyBytesPerSource: s.OpAMPBodyBytesPerSource}
}
