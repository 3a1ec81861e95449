package apiclient

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// ContextsEnv names the contexts file instead of DefaultContextsPath.
const ContextsEnv = "MYRIARCH_CONTEXTS"

// Context is one named cluster: a replica's URL, a token, a CA.
type Context struct {
	Name   string `json:"name"`
	Server string `json:"server"`
	Token  string `json:"token,omitempty"`
	CAFile string `json:"ca_file,omitempty"`
}

// Contexts is the contexts file: like kubectl's kubeconfig, several
// clusters and the one in use.
type Contexts struct {
	Current  string    `json:"current"`
	Contexts []Context `json:"contexts"`
	path     string
}

// ContextsPath is the file: $MYRIARCH_CONTEXTS, else
// $XDG_CONFIG_HOME/myriarch/contexts.yaml (~/.config/... by default).
func ContextsPath() (string, error) {
	if p := os.Getenv(ContextsEnv); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("contexts file: %w (set %s)", err, ContextsEnv)
	}
	return filepath.Join(dir, "myriarch", "contexts.yaml"), nil
}

// LoadContexts reads the file at path; a missing file is an empty one.
// The file holds tokens: one that others can read (any group or other
// permission bit) is refused, naming the fix.
func LoadContexts(path string) (*Contexts, error) {
	c := &Contexts{path: path}
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("contexts file %s: mode %04o: must be readable by its owner only, as it holds API tokens (chmod 600 %s)",
			path, st.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict(b, c); err != nil {
		return nil, fmt.Errorf("contexts file %s: %w", path, err)
	}
	for i, x := range c.Contexts {
		if x.Name == "" {
			return nil, fmt.Errorf("contexts file %s: contexts[%d].name: must not be empty", path, i)
		}
	}
	if c.Current != "" {
		if _, ok := c.Get(c.Current); !ok {
			return nil, fmt.Errorf("contexts file %s: current %q: no context has this name", path, c.Current)
		}
	}
	return c, nil
}

// Path is the file the contexts were read from.
func (c *Contexts) Path() string { return c.path }

// Get returns the context named name.
func (c *Contexts) Get(name string) (Context, bool) {
	i := slices.IndexFunc(c.Contexts, func(x Context) bool { return x.Name == name })
	if i < 0 {
		return Context{}, false
	}
	return c.Contexts[i], true
}

// Names lists the contexts' names.
func (c *Contexts) Names() []string {
	var n []string
	for _, x := range c.Contexts {
		n = append(n, x.Name)
	}
	return n
}

// Set adds or replaces a context; the first one becomes current.
func (c *Contexts) Set(x Context) {
	if i := slices.IndexFunc(c.Contexts, func(y Context) bool { return y.Name == x.Name }); i >= 0 {
		c.Contexts[i] = x
	} else {
		c.Contexts = append(c.Contexts, x)
	}
	if c.Current == "" {
		c.Current = x.Name
	}
}

// Delete removes a context.
func (c *Contexts) Delete(name string) bool {
	n := len(c.Contexts)
	c.Contexts = slices.DeleteFunc(c.Contexts, func(x Context) bool { return x.Name == name })
	if c.Current == name {
		c.Current = ""
	}
	return len(c.Contexts) < n
}

// Save writes the file with mode 0600 (and its directory 0700 when it
// creates it), through a temporary file renamed over it.
func (c *Contexts) Save() error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".contexts-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), c.path)
}

// Resolve picks the server, token and CA of a command: a flag given on
// the command line wins, then the context named by --context, then the
// environment (MYRIARCH_SERVER, MYRIARCH_TOKEN, MYRIARCH_CA_FILE), then
// the contexts file's current context, then DefaultServer.
//
// A token is a cluster's: without a flag or --context, a token from the
// environment is not sent to the current context's server when that
// context holds a token of its own, nor the current context's token to a
// MYRIARCH_SERVER that is not the context's server. Options refuses those
// mixtures, naming both sides (after `context use lab`, a prod token left
// in MYRIARCH_TOKEN went to the lab).
type Resolve struct {
	Server, Token, CAFile string // from flags; "" when not given
	Context               string // --context
}

// DefaultServer is the server when nothing names one.
const DefaultServer = "http://127.0.0.1:8080"

// Options resolves r into client options.
func (r Resolve) Options() (Options, error) {
	o := Options{Server: r.Server, Token: r.Token, CAFile: r.CAFile}
	// Where the server and the token came from: "flag", "env", or
	// "context" (the contexts file's, named or current).
	var serverFrom, tokenFrom string
	if o.Server != "" {
		serverFrom = "flag"
	}
	if o.Token != "" {
		tokenFrom = "flag"
	}
	fill := func(dst *string, v string, from *string, src string) {
		if *dst == "" && v != "" {
			*dst = v
			if from != nil {
				*from = src
			}
		}
	}
	env := func() {
		fill(&o.Server, os.Getenv("MYRIARCH_SERVER"), &serverFrom, "env")
		fill(&o.Token, os.Getenv("MYRIARCH_TOKEN"), &tokenFrom, "env")
		fill(&o.CAFile, os.Getenv("MYRIARCH_CA_FILE"), nil, "")
	}
	// A context named on the command line is a flag: it wins over the
	// environment, so that a token of another cluster in MYRIARCH_TOKEN
	// is never sent to the server it names.
	if r.Context == "" {
		env()
	}
	if o.Server == "" || o.Token == "" || r.Context != "" {
		path, err := ContextsPath()
		if err != nil {
			return o, err
		}
		cs, err := LoadContexts(path)
		if err != nil {
			return o, err
		}
		name := r.Context
		if name == "" {
			name = cs.Current
		}
		if name != "" {
			x, ok := cs.Get(name)
			if !ok {
				return o, fmt.Errorf("context %q: not in %s (contexts: %s)", name, path, strings.Join(cs.Names(), ", "))
			}
			if r.Context == "" {
				if err := mixed(o, serverFrom, tokenFrom, x); err != nil {
					return o, err
				}
			}
			fill(&o.Server, x.Server, &serverFrom, "context")
			fill(&o.Token, x.Token, &tokenFrom, "context")
			fill(&o.CAFile, x.CAFile, nil, "")
		}
	}
	if r.Context != "" {
		env()
	}
	fill(&o.Server, DefaultServer, &serverFrom, "default")
	return o, nil
}

// mixed refuses to pair the environment's token with the current context
// x's server, or x's token with the environment's server, when they are
// likely two clusters' (no flag chose either).
func mixed(o Options, serverFrom, tokenFrom string, x Context) error {
	switch {
	case tokenFrom == "env" && serverFrom == "" && x.Server != "" && x.Token != "" && x.Token != o.Token:
		return fmt.Errorf("MYRIARCH_TOKEN is set but MYRIARCH_SERVER is not: the token would go to %s, the server of the current context %q, which holds a token of its own; "+
			"set MYRIARCH_SERVER (or --server) to the token's server, pass --context %s to use the context's token, or unset MYRIARCH_TOKEN", x.Server, x.Name, x.Name)
	case serverFrom == "env" && tokenFrom == "" && x.Token != "" && x.Server != o.Server:
		return fmt.Errorf("MYRIARCH_SERVER %s is set but MYRIARCH_TOKEN is not: the token would be the current context %q's, whose server is %s; "+
			"set MYRIARCH_TOKEN (or --token) for %s, pass --context %s, or unset MYRIARCH_SERVER", o.Server, x.Name, x.Server, o.Server, x.Name)
	}
	return nil
}
