// Package configs is myriarchd's configuration model: named configurations
// with immutable numbered revisions, their validation hooks per type, the
// diff between two revisions, and the assignment of a configuration to
// agents by label selector.
//
// Assignment: a configuration has a selector (key=value pairs that an
// agent's attributes must all contain, the syntax of the agents API) and a
// priority. When several configurations match an agent, the highest
// priority wins, then the smallest name; so every agent is assigned at most
// one configuration, and a rollout of a configuration reaches exactly the
// agents assigned to it. An agent's desired revision is set by rollouts
// (package rollout), and a new agent without any desired config is given
// the current revision of its configuration; storing a revision delivers
// nothing.
//
// Validation runs before a revision is stored, so a configuration that the
// agent would refuse never starts rolling: every type must be well-formed
// YAML, and a type may have a validator that checks more. The validators
// are registered by the program that assembles myriarchd (its composition
// root, cmd/myriarchd): this package does not import the agents' code. For
// myriarch-bridge that is the bridge's own check in its remote form
// (internal/bridge/config.ValidateRemote): every rule that `myriarch-bridge
// check` applies except reading the files and variables that the
// configuration names, which exist on the bridge's host only; the bridge
// checks those when it applies the configuration and reports a missing one
// as FAILED. A type whose validator is not registered is refused, not
// stored unchecked.
package configs

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Configuration types.
const (
	TypeYAML   = "yaml"
	TypeBridge = "myriarch-bridge"
)

// Validator checks the content of a configuration of one type, after it
// was found well-formed YAML. source names where the content came from (a
// file given on the command line, or "config"), so that its problems name
// that place.
type Validator func(source, content string) error

var (
	validatorsMu sync.RWMutex
	// validators by type; nil for a known type whose validator is not
	// registered in this program. Plain YAML needs nothing more than being
	// well-formed.
	validators = map[string]Validator{TypeYAML: func(string, string) error { return nil }, TypeBridge: nil}
)

// RegisterValidator sets the validator of type typ (a new type becomes
// known). The composition root calls it before anything validates:
// cmd/myriarchd registers the bridge's check for TypeBridge.
func RegisterValidator(typ string, v Validator) {
	validatorsMu.Lock()
	defer validatorsMu.Unlock()
	validators[typ] = v
}

func validatorOf(typ string) (Validator, bool) {
	validatorsMu.RLock()
	defer validatorsMu.RUnlock()
	v, ok := validators[typ]
	return v, ok
}

// Types lists the known types.
func Types() []string {
	validatorsMu.RLock()
	defer validatorsMu.RUnlock()
	out := make([]string, 0, len(validators))
	for t := range validators {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

func validateYAML(content string) error {
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(content), &n); err != nil {
		return fmt.Errorf("not well-formed YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return nil
}

// DefaultSource is the source of content that came without a file name
// (the API, the UI, GitOps).
const DefaultSource = "config"

// Validate runs the checks of typ on content (source DefaultSource).
func Validate(typ, content string) error { return ValidateFrom(typ, DefaultSource, content) }

// ValidateFrom is Validate for content read from source (a file name).
func ValidateFrom(typ, source, content string) error {
	v, ok := validatorOf(typ)
	if !ok {
		return fmt.Errorf("type %q: must be one of %s", typ, strings.Join(Types(), ", "))
	}
	if strings.TrimSpace(content) == "" {
		return errors.New("content: must not be empty")
	}
	err := validateYAML(content)
	if err == nil && v == nil {
		err = errors.New("no check for this type is registered in this program; its revisions are refused rather than stored unchecked")
	}
	if err == nil && v != nil {
		err = v(source, content)
	}
	if err != nil {
		return fmt.Errorf("content (type %s): %w", typ, err)
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$`)

// CheckName checks a configuration name.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("name %q: must be 1 to 64 characters of a-z, 0-9, '.', '_' and '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// CheckDef checks the parts of a configuration definition.
func CheckDef(c store.ConfigDef) error {
	var errs []error
	if err := CheckName(c.Name); err != nil {
		errs = append(errs, err)
	}
	if _, ok := validatorOf(c.Type); !ok {
		errs = append(errs, fmt.Errorf("type %q: must be one of %s", c.Type, strings.Join(Types(), ", ")))
	}
	for k := range c.Selector {
		if strings.TrimSpace(k) == "" {
			errs = append(errs, errors.New("selector: keys must not be empty"))
		}
	}
	if c.Priority < -1000000 || c.Priority > 1000000 {
		errs = append(errs, fmt.Errorf("priority %d: must be within [-1000000, 1000000]", c.Priority))
	}
	return errors.Join(errs...)
}

// Service stores configurations and revisions after validation.
type Service struct {
	Store *store.Store
}

// Put creates or updates a configuration definition.
func (s Service) Put(ctx context.Context, c store.ConfigDef) (bool, error) {
	if err := CheckDef(c); err != nil {
		return false, &InvalidError{Err: err}
	}
	var created bool
	err := pgx.BeginFunc(ctx, s.Store.Pool, func(tx pgx.Tx) error {
		var err error
		created, err = store.PutConfig(ctx, tx, c)
		return err
	})
	if errors.Is(err, store.ErrTypeChange) {
		return false, &InvalidError{Err: err}
	}
	return created, err
}

// AddRevision validates content against the type of configuration name and
// stores it as its next revision (unless it equals the newest one).
func (s Service) AddRevision(ctx context.Context, name, content, author, commit string) (store.Revision, bool, error) {
	return s.AddRevisionFrom(ctx, name, DefaultSource, content, author, commit)
}

// AddRevisionFrom is AddRevision for content read from source (a file
// name), which its problems name.
func (s Service) AddRevisionFrom(ctx context.Context, name, source, content, author, commit string) (store.Revision, bool, error) {
	var rev store.Revision
	var created bool
	err := pgx.BeginFunc(ctx, s.Store.Pool, func(tx pgx.Tx) error {
		var err error
		rev, created, err = addRevision(ctx, tx, name, source, content, author, commit)
		return err
	})
	return rev, created, err
}

// AddRevision is Service.AddRevision inside a caller's transaction (GitOps
// writes it in a fenced one).
func AddRevision(ctx context.Context, q store.Querier, name, content, author, commit string) (store.Revision, bool, error) {
	return addRevision(ctx, q, name, DefaultSource, content, author, commit)
}

func addRevision(ctx context.Context, q store.Querier, name, source, content, author, commit string) (store.Revision, bool, error) {
	c, err := store.GetConfig(ctx, q, name)
	if err != nil {
		return store.Revision{}, false, err
	}
	if err := ValidateFrom(c.Type, source, content); err != nil {
		return store.Revision{}, false, &InvalidError{Err: err, Content: true}
	}
	return store.AddRevision(ctx, q, name, content, author, commit)
}

// InvalidError is refused input: a bad definition or request (HTTP 400),
// or, with Content, content that its type's checks refuse (HTTP 422, as
// for an agent's own remote configuration).
type InvalidError struct {
	Err     error
	Content bool
}

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

// Diff returns a unified diff (3 lines of context) from a to b, with the
// given labels; "" when they are equal.
func Diff(aLabel, bLabel, a, b string) string {
	if a == b {
		return ""
	}
	x, y := splitLines(a), splitLines(b)
	ops := lcsOps(x, y)
	var out strings.Builder
	fmt.Fprintf(&out, "--- %s\n+++ %s\n", aLabel, bLabel)
	const ctx = 3
	// Group the edit script into hunks with up to ctx lines of context.
	i := 0
	for i < len(ops) {
		if ops[i].kind == ' ' {
			i++
			continue
		}
		start := max(i-ctx, 0)
		end := i
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			// A run of equal lines longer than 2·ctx ends the hunk.
			run := end
			for run < len(ops) && ops[run].kind == ' ' {
				run++
			}
			if run == len(ops) || run-end > 2*ctx {
				end = min(end+ctx, len(ops))
				break
			}
			end = run
		}
		h := ops[start:end]
		aStart, bStart := h[0].ai, h[0].bi
		var aN, bN int
		for _, o := range h {
			if o.kind != '+' {
				aN++
			}
			if o.kind != '-' {
				bN++
			}
		}
		fmt.Fprintf(&out, "@@ -%s +%s @@\n", hunkRange(aStart, aN), hunkRange(bStart, bN))
		for _, o := range h {
			out.WriteByte(o.kind)
			out.WriteString(o.line)
			out.WriteByte('\n')
		}
		i = end
	}
	return out.String()
}

func hunkRange(start, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	if n == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}

func splitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

type op struct {
	kind   byte // ' ', '-', '+'
	line   string
	ai, bi int // positions in a and b before this line
}

// lcsOps is the edit script of a longest common subsequence. Inputs whose
// table would exceed maxCells are diffed as a whole replacement.
func lcsOps(a, b []string) []op {
	const maxCells = 16 << 20
	n, m := len(a), len(b)
	var ops []op
	if n*m > maxCells {
		for i, l := range a {
			ops = append(ops, op{'-', l, i, 0})
		}
		for j, l := range b {
			ops = append(ops, op{'+', l, n, j})
		}
		return ops
	}
	// t[i][j] = LCS length of a[i:], b[j:].
	t := make([][]int32, n+1)
	for i := range t {
		t[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				t[i][j] = t[i+1][j+1] + 1
			} else {
				t[i][j] = max(t[i+1][j], t[i][j+1])
			}
		}
	}
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			ops = append(ops, op{' ', a[i], i, j})
			i++
			j++
		case i < n && (j == m || t[i+1][j] >= t[i][j+1]):
			ops = append(ops, op{'-', a[i], i, j})
			i++
		default:
			ops = append(ops, op{'+', b[j], i, j})
			j++
		}
	}
	return ops
}

// SortedKeys returns the keys of a selector in order (for display).
func SortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// FormatSelector prints a selector in the k=v,k2=v2 syntax.
func FormatSelector(m map[string]string) string {
	parts := make([]string, 0, len(m))
	for _, k := range SortedKeys(m) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}
