package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Problem is one refused piece of the configuration.
type Problem struct {
	File  string
	Line  int    // 0 when unknown
	Path  string // e.g. routes[0].lease_ttl
	Value string // as written, quoted when a string
	Rule  string
}

func (p Problem) Error() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
	}
	b.WriteString(": ")
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	if p.Value != "" {
		b.WriteString(p.Value)
		b.WriteString(": ")
	}
	b.WriteString(p.Rule)
	return b.String()
}

// Problems is every problem of one file; Load returns it as its error.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse validates data as the configuration file named name. Secrets named
// by password_file and dsn_file are read; nothing else is opened.
func Parse(name string, data []byte) (*Config, error) {
	cfg, problems := Check(name, data)
	if len(problems) > 0 {
		return nil, problems
	}
	return cfg, nil
}

// Check is Parse for disclosure: with problems it still returns what it
// resolved (nil only when the YAML itself is unusable), so that
// `myriarch-bridge check` can show the budgets of refused sessions.
func Check(name string, data []byte) (*Config, Problems) {
	return check(&validator{file: name, lines: map[string]int{}}, data)
}

// CheckRemote is Check away from the host of the bridge that will run the
// configuration: myriarchd runs it before it stores or sends one. It runs
// every rule that does not need that host (syntax, keys, single values,
// the rules that relate keys, admission) and reads nothing: the files named
// by password_file, dsn_file, enrollment_secret_file and tls (ca_file,
// cert_file, key_file), and the variables named by *_env, are the bridge
// host's. The bridge checks them when it applies the configuration (Check,
// through runtime.Bridge.ApplyFile) and reports a missing one, named, as
// FAILED. A Config it returns has no secrets in it: it is for reports, not
// for running.
func CheckRemote(name string, data []byte) (*Config, Problems) {
	return check(&validator{file: name, lines: map[string]int{}, remote: true}, data)
}

// ValidateRemote is CheckRemote as myriarchd's validator of the
// configuration type myriarch-bridge (cmd/myriarchd registers it): nil, or
// an error that lists every problem, each naming source (a file given on
// myriarchd's command line, or "config"), line, key, value and rule.
func ValidateRemote(source, content string) error {
	if _, problems := CheckRemote(source, []byte(content)); len(problems) > 0 {
		return fmt.Errorf("refused by the bridge's check: %w", problems)
	}
	return nil
}

func check(v *validator, data []byte) (*Config, Problems) {
	name := v.file
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, Problems{{File: name, Rule: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}}
	}
	if root.Kind == 0 {
		return nil, Problems{{File: name, Rule: "the file is empty"}}
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	v.walk(doc, &topTable, "")

	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			v.problems = append(v.problems, Problem{File: name, Rule: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")})
			return nil, v.problems
		}
		for _, msg := range te.Errors {
			if strings.Contains(msg, "not found in type") {
				continue // reported with its path by walk
			}
			line := 0
			if rest, ok := strings.CutPrefix(msg, "line "); ok {
				if n, _, ok := strings.Cut(rest, ":"); ok {
					line, _ = strconv.Atoi(n)
					msg = strings.TrimSpace(rest[len(n)+1:])
				}
			}
			v.problems = append(v.problems, Problem{File: name, Line: line, Rule: "wrong type: " + msg})
		}
	}
	if len(v.problems) > 0 {
		return nil, v.problems
	}
	cfg := v.validate(&f)
	cfg.OpAMP = v.opamp(f.OpAMP)
	return cfg, v.problems
}

// walk records the line of every path and reports keys that the table
// does not know, with the keys it does.
func (v *validator) walk(n *yaml.Node, t *Table, path string) {
	if path != "" {
		v.lines[path] = n.Line
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	if n.Kind != yaml.MappingNode {
		v.problems = append(v.problems, Problem{File: v.file, Line: n.Line, Path: path, Value: shortValue(n), Rule: "must be a mapping"})
		return
	}
	if t == &senderTable {
		v.sender = [2]string{scalar(n, "id"), scalar(n, "type")}
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		p := join(path, k.Value)
		row, sub, ok := t.child(k.Value, p)
		if !ok {
			v.problems = append(v.problems, Problem{File: v.file, Line: k.Line, Path: p, Rule: v.unknown(t, k.Value, path)})
			continue
		}
		if seen[k.Value] {
			v.problems = append(v.problems, Problem{File: v.file, Line: k.Line, Path: p, Rule: "key appears twice"})
		}
		seen[k.Value] = true
		v.walkValue(val, row, sub, p)
	}
}

// walkValue walks the value of one key: a nested mapping (row nil), or
// the value of row.
func (v *validator) walkValue(n *yaml.Node, row *Row, sub *Table, path string) {
	if row == nil || row.Kind == Object {
		v.walk(n, sub, path)
		return
	}
	v.lines[path] = n.Line
	switch row.Kind {
	case Objects, Strings:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return
		}
		if n.Kind != yaml.SequenceNode {
			v.problems = append(v.problems, Problem{File: v.file, Line: n.Line, Path: path, Value: shortValue(n), Rule: "must be a list"})
			return
		}
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if row.Kind == Objects {
				v.walk(c, row.Table, p)
			} else {
				v.lines[p] = c.Line
			}
		}
	case StringMap:
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				v.lines[join(path, n.Content[i].Value)] = n.Content[i].Line
			}
		}
	}
}

// unknown is the rule broken by a key that table t does not know. A key of
// another sender type on a sender says whose it is.
func (v *validator) unknown(t *Table, key, path string) string {
	if t == &senderTable || t.SenderType != "" {
		id, typ := v.sender[0], v.sender[1]
		var owners []string
		for _, st := range senderTypes {
			if _, _, ok := st.child(key, ""); ok && st.SenderType != t.SenderType {
				owners = append(owners, st.SenderType)
			}
		}
		switch {
		case t == &senderTable && slices.Contains(owners, typ):
			return fmt.Sprintf("sender %q (type %s): field %q belongs in its %s block", id, typ, key, typ)
		case len(owners) > 0:
			return fmt.Sprintf("sender %q (type %s): field %q belongs to type %s", id, typ, key, orList(owners))
		}
	}
	return fmt.Sprintf("unknown key; %s accepts %s", orRoot(path), strings.Join(t.keys(), ", "))
}

// scalar returns the value of key in mapping n, or "".
func scalar(n *yaml.Node, key string) string {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

func orRoot(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func shortValue(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	}
	return ""
}
