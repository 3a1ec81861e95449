package config

import (
	"bytes"
	"errors"
	"net/url"
	"strings"

	"gopkg.in/yaml.v3"
)

// WithLocalOpAMP returns remote, a configuration received from myriarchd,
// with the opamp block of local (the file on disk) when remote has none:
// the server manages the bridge's routes, not how the bridge reaches the
// server. A remote configuration with its own opamp block is returned as
// it is (a different block is then refused by Compare: it takes a
// restart).
func WithLocalOpAMP(remote, local []byte) ([]byte, error) {
	rdoc, rroot, err := mapping(remote)
	if err != nil || rroot == nil || hasKey(rroot, "opamp") {
		return remote, nil // Check reports what is wrong with it
	}
	_, lroot, err := mapping(local)
	if err != nil || lroot == nil {
		return remote, nil
	}
	for i := 0; i+1 < len(lroot.Content); i += 2 {
		if lroot.Content[i].Value == "opamp" {
			rroot.Content = append(rroot.Content, lroot.Content[i], lroot.Content[i+1])
			var b bytes.Buffer
			enc := yaml.NewEncoder(&b)
			enc.SetIndent(2)
			if err := enc.Encode(rdoc); err != nil {
				return nil, err
			}
			return b.Bytes(), nil
		}
	}
	return remote, nil
}

// mapping parses data and returns the document and its top-level mapping
// (nil when it is not a mapping).
func mapping(data []byte) (*yaml.Node, *yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return &doc, nil, nil
	}
	return &doc, doc.Content[0], nil
}

func hasKey(m *yaml.Node, key string) bool {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return true
		}
	}
	return false
}

// secretKeys are keys whose values are secrets wherever they appear.
var secretKeys = map[string]bool{"dsn": true, "password": true, "secret": true, "token": true, "enrollment_secret": true}

// Redacted returns the configuration file data with every secret value
// replaced by "[redacted]": inline secrets (dsn, password, secret,
// token), every HTTP header value, and the password of any URL. Files and
// environment variables named by *_file and *_env keys are names, not
// secrets, and stay. Data that is not YAML is not returned at all.
func Redacted(data []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, errors.New("the configuration is not valid YAML")
	}
	redact(&doc, false)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func redact(n *yaml.Node, all bool) {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			redact(c, all)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			redact(v, all || secretKeys[k.Value] || k.Value == "headers")
		}
	case yaml.ScalarNode:
		switch {
		case all:
			n.Value, n.Tag, n.Style = "[redacted]", "!!str", 0
		case strings.Contains(n.Value, "://"):
			if u, err := url.Parse(n.Value); err == nil && u.User != nil {
				if _, ok := u.User.Password(); ok {
					u.User = url.UserPassword(u.User.Username(), "redacted")
					n.Value = u.String()
				}
			}
		}
	case yaml.AliasNode:
		// An alias repeats a node redacted where it is defined.
	}
}
