package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestTableOwners fails for every string of SQL in the production code
// (non-test .go files) of a package that names a table that package does
// not own (TableOwners), with the file and line, the table and its owner.
func TestTableOwners(t *testing.T) {
	root := moduleRoot(t)
	pkgs, fset, err := parseModule(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range checkTables(fset, pkgs, "github.com/myriarch/myriarch") {
		t.Error(v)
	}
}

// TestTableOwnersCatches proves the checker: SQL naming another package's
// table fails, in a literal, in a concatenation with a constant of the
// owner package, in a comma join of a FROM list, in DELETE FROM, case
// insensitive; the owner's own SQL, a longer name with a table's name as
// its prefix, prose without SQL and pgx.Identifier of its own table pass.
func TestTableOwnersCatches(t *testing.T) {
	const mod = "example.com/m"
	files := map[string]string{
		"internal/fleet/store/s.go": `package store
const PrecedenceSQL = "(SELECT c.name FROM configs c WHERE c.x)"
const agentCols = "instance_uid, status"
func own() { q("SELECT " + agentCols + " FROM agents"); q("UPDATE agents SET x = 1") }
`,
		"internal/fleet/rollout/r.go": `package rollout
import (
	"example.com/m/internal/fleet/store"
	"github.com/jackc/pgx/v5"
)
func a() {
	q(` + "`SELECT id\n\t\tFROM rollouts r JOIN agents a ON a.uid = r.uid`" + `)
	q("SELECT 1 FROM x WHERE n = " + store.PrecedenceSQL)
	q("select 1 from rollout_agents ra, agents a")
	q("DELETE FROM agent_events WHERE at < now()")
	q("SELECT 1 FROM agents_archive")
	q("INSERT INTO rollout_waves VALUES (1)")
	_ = pgx.Identifier{"rollout_agents"}
	_ = pgx.Identifier{"job_runs"}
	log("no report from agents yet")
}
`,
	}
	fset := token.NewFileSet()
	byDir := map[string][]*ast.File{}
	for name, src := range files {
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		byDir[path.Dir(name)] = append(byDir[path.Dir(name)], f)
	}
	var pkgs []pkgSource
	for dir, fs := range byDir {
		pkgs = append(pkgs, pkgSource{dir: dir, files: fs})
	}
	var got []string
	for _, v := range checkTables(fset, pkgs, mod) {
		got = append(got, fmt.Sprintf("%s:%d %s", v.pos.Filename, v.pos.Line, v.table))
	}
	sort.Strings(got)
	want := []string{
		"internal/fleet/rollout/r.go:10 agents",
		"internal/fleet/rollout/r.go:11 agent_events",
		"internal/fleet/rollout/r.go:15 job_runs",
		"internal/fleet/rollout/r.go:8 agents",
		"internal/fleet/rollout/r.go:9 configs",
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestSQLTables checks the scanner of SQL text on its own.
func TestSQLTables(t *testing.T) {
	for sql, want := range map[string]string{
		"SELECT a FROM agents":                               "agents",
		"select a from agents a, rollouts r where a.x = 1":   "agents rollouts",
		"SELECT 1 FROM agents AS a, jsonb_each(a.x) AS p(k)": "agents",
		"DELETE FROM job_runs WHERE x":                       "job_runs",
		"UPDATE rollout_agents ra SET x = 1 FROM agents a":   "rollout_agents agents",
		"LOCK TABLE rollouts IN SHARE ROW EXCLUSIVE MODE":    "rollouts",
		"CREATE TABLE IF NOT EXISTS myriarch_leases (x int)": "myriarch_leases",
		"INSERT INTO public.configs (name) VALUES ($1)":      "configs",
		"SELECT 1 FROM agents_archive":                       "",
		"the agents report from agents":                      "",
		"no update of agents was sent":                       "",
	} {
		got := strings.Join(sqlTables(sql, knownTables()), " ")
		if got != want {
			t.Errorf("sqlTables(%q) = %q, want %q", sql, got, want)
		}
	}
}

type pkgSource struct {
	dir   string // relative to the module root, slash-separated
	files []*ast.File
}

type violation struct {
	pos    token.Position
	table  string
	pkg    string
	owners []string
}

func (v violation) String() string {
	return fmt.Sprintf("%s:%d: SQL naming table %s in package %s; its owner is %s: call the owner's function instead",
		v.pos.Filename, v.pos.Line, v.table, v.pkg, strings.Join(v.owners, " or "))
}

func moduleRoot(t *testing.T) string {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	return root
}

// parseModule parses every non-test .go file of the module at root (not of
// nested modules, testdata or hidden directories), by package directory.
func parseModule(root string) ([]pkgSource, *token.FileSet, error) {
	fset := token.NewFileSet()
	byDir := map[string][]*ast.File{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root {
				if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" || name == "node_modules" {
					return filepath.SkipDir
				}
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, filepath.ToSlash(rel), src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := path.Dir(filepath.ToSlash(rel))
		byDir[dir] = append(byDir[dir], f)
		return nil
	})
	var pkgs []pkgSource
	for dir, files := range byDir {
		pkgs = append(pkgs, pkgSource{dir: dir, files: files})
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].dir < pkgs[j].dir })
	return pkgs, fset, err
}

func knownTables() map[string][]string {
	m := map[string][]string{}
	for _, o := range TableOwners {
		m[o.Table] = append(m[o.Table], o.Owner)
	}
	return m
}

var (
	// sqlVerb tells SQL from prose: a string is SQL when it has a
	// statement's verb.
	sqlVerb = regexp.MustCompile(`(?i)\b(select|insert|update|delete|create|alter|drop|lock|truncate)\b`)
	// tableRef is a keyword followed by a table name.
	tableRef = regexp.MustCompile(`(?i)\b(from|into|update|join|table)\s+(?:only\s+)?(?:if\s+(?:not\s+)?exists\s+)?([a-z_][a-z0-9_.]*)`)
	// fromItem continues a FROM list: an alias, then ", name".
	fromAlias = regexp.MustCompile(`(?i)^\s+(?:as\s+)?([a-z_][a-z0-9_]*)`)
	fromNext  = regexp.MustCompile(`(?i)^\s*,\s*([a-z_][a-z0-9_.]*)`)
	notAlias  = regexp.MustCompile(`(?i)^(where|join|left|right|inner|outer|full|cross|on|using|group|order|limit|offset|for|union|except|intersect|returning|set|natural|window|having|lateral)$`)
)

// sqlTables returns the known tables that SQL text names after FROM (also
// DELETE FROM and every item of a comma-separated FROM list), INTO,
// UPDATE, JOIN or TABLE, in order of appearance. Text without a
// statement's verb is not SQL and names nothing.
func sqlTables(s string, known map[string][]string) []string {
	var out []string
	for _, r := range sqlRefs(s, known) {
		out = append(out, r.table)
	}
	return out
}

type sqlRef struct {
	table string
	at    int // byte offset in the text
}

func sqlRefs(s string, known map[string][]string) []sqlRef {
	if !sqlVerb.MatchString(s) {
		return nil
	}
	var out []sqlRef
	add := func(name string, at int) {
		name = strings.ToLower(name)
		if i := strings.LastIndexByte(name, '.'); i >= 0 {
			name = name[i+1:]
		}
		if _, ok := known[name]; ok {
			out = append(out, sqlRef{name, at})
		}
	}
	for _, m := range tableRef.FindAllStringSubmatchIndex(s, -1) {
		add(s[m[4]:m[5]], m[4])
		if !strings.EqualFold(s[m[2]:m[3]], "from") {
			continue
		}
		// The rest of a FROM list: [alias] {, name [alias]}.
		rest, off := s[m[5]:], m[5]
		for {
			if strings.HasPrefix(rest, "(") { // a function's arguments
				depth := 0
				i := strings.IndexFunc(rest, func(r rune) bool {
					switch r {
					case '(':
						depth++
					case ')':
						depth--
					}
					return depth == 0
				})
				if i < 0 {
					break
				}
				rest, off = rest[i+1:], off+i+1
			}
			if a := fromAlias.FindStringSubmatchIndex(rest); a != nil && !notAlias.MatchString(rest[a[2]:a[3]]) {
				rest, off = rest[a[1]:], off+a[1]
				if strings.HasPrefix(rest, "(") { // column aliases: p(k, s)
					if i := strings.IndexByte(rest, ')'); i >= 0 {
						rest, off = rest[i+1:], off+i+1
					}
				}
			}
			n := fromNext.FindStringSubmatchIndex(rest)
			if n == nil {
				break
			}
			add(rest[n[2]:n[3]], off+n[2])
			rest, off = rest[n[1]:], off+n[1]
		}
	}
	return out
}

// part is a piece of a string expression: its text and where it starts in
// the source.
type part struct {
	text string
	pos  token.Pos
	raw  bool // a raw string literal: its lines are the source's lines
}

// checkTables returns the violations of TableOwners in pkgs (directories
// relative to the module mod). It reads string literals, concatenations of
// literals and string constants (of the same package or another package of
// the module), and pgx.Identifier literals; SQL assembled at run time from
// variables (fmt.Sprintf) is beyond it.
func checkTables(fset *token.FileSet, pkgs []pkgSource, mod string) []violation {
	known := knownTables()
	consts := moduleConsts(pkgs, mod)
	var out []violation
	seen := map[string]bool{}
	report := func(pkg string, pos token.Position, table string) {
		if slices.Contains(known[table], pkg) {
			return
		}
		k := fmt.Sprintf("%s:%d:%s", pos.Filename, pos.Line, table)
		if seen[k] {
			return
		}
		seen[k] = true
		out = append(out, violation{pos: pos, table: table, pkg: pkg, owners: known[table]})
	}
	for _, p := range pkgs {
		for _, f := range p.files {
			imports := fileImports(f, mod)
			pgxName := ""
			for _, im := range f.Imports {
				if v, _ := strconv.Unquote(im.Path.Value); v == "github.com/jackc/pgx/v5" {
					pgxName = "pgx"
					if im.Name != nil {
						pgxName = im.Name.Name
					}
				}
			}
			scan := func(parts []part) {
				var b strings.Builder
				starts := make([]int, len(parts))
				for i, pt := range parts {
					starts[i] = b.Len()
					b.WriteString(pt.text)
				}
				text := b.String()
				for _, r := range sqlRefs(text, known) {
					i := sort.SearchInts(starts, r.at+1) - 1
					pt := parts[i]
					pos := fset.Position(pt.pos)
					if pt.raw {
						pos.Line += strings.Count(pt.text[:r.at-starts[i]], "\n")
					}
					report(p.dir, pos, r.table)
				}
			}
			var walk func(n ast.Node) bool
			walk = func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.GenDecl:
					// Constants are read where they are declared.
				case *ast.BinaryExpr:
					if n.Op != token.ADD {
						return true
					}
					parts, others := flatten(n, p.dir, imports, consts)
					scan(parts)
					for _, o := range others {
						ast.Inspect(o, walk)
					}
					return false
				case *ast.BasicLit:
					if n.Kind == token.STRING {
						s, err := strconv.Unquote(n.Value)
						if err == nil {
							scan([]part{{s, n.Pos(), strings.HasPrefix(n.Value, "`")}})
						}
					}
				case *ast.CompositeLit:
					if sel, ok := n.Type.(*ast.SelectorExpr); ok && pgxName != "" && sel.Sel.Name == "Identifier" {
						if x, ok := sel.X.(*ast.Ident); ok && x.Name == pgxName && len(n.Elts) > 0 {
							if lit, ok := n.Elts[len(n.Elts)-1].(*ast.BasicLit); ok {
								if s, err := strconv.Unquote(lit.Value); err == nil {
									if _, ok := known[s]; ok {
										report(p.dir, fset.Position(lit.Pos()), s)
									}
								}
							}
							return false
						}
					}
				}
				return true
			}
			ast.Inspect(f, walk)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].pos.Filename != out[j].pos.Filename {
			return out[i].pos.Filename < out[j].pos.Filename
		}
		return out[i].pos.Line < out[j].pos.Line
	})
	return out
}

// fileImports maps the names under which f imports packages of the module
// to their directories.
func fileImports(f *ast.File, mod string) map[string]string {
	m := map[string]string{}
	for _, im := range f.Imports {
		p, err := strconv.Unquote(im.Path.Value)
		if err != nil || !strings.HasPrefix(p, mod+"/") {
			continue
		}
		name := path.Base(p)
		if im.Name != nil {
			name = im.Name.Name
		}
		m[name] = strings.TrimPrefix(p, mod+"/")
	}
	return m
}

// flatten returns the string parts of a concatenation (literals and known
// constants; anything else stands as " ? ") and the operands that are
// neither, to be walked on their own.
func flatten(e ast.Expr, dir string, imports map[string]string, consts map[string]map[string]string) ([]part, []ast.Expr) {
	switch e := e.(type) {
	case *ast.ParenExpr:
		return flatten(e.X, dir, imports, consts)
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			l, lo := flatten(e.X, dir, imports, consts)
			r, ro := flatten(e.Y, dir, imports, consts)
			return append(l, r...), append(lo, ro...)
		}
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
			return []part{{s, e.Pos(), strings.HasPrefix(e.Value, "`")}}, nil
		}
	}
	if s, ok := constValue(e, dir, imports, consts); ok {
		return []part{{s, e.Pos(), false}}, nil
	}
	return []part{{" ? ", e.Pos(), false}}, []ast.Expr{e}
}

func constValue(e ast.Expr, dir string, imports map[string]string, consts map[string]map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.Ident:
		s, ok := consts[dir][e.Name]
		return s, ok
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			if d, ok := imports[x.Name]; ok {
				s, ok := consts[d][e.Sel.Name]
				return s, ok
			}
		}
	}
	return "", false
}

// moduleConsts evaluates the package-level string constants of pkgs that
// are literals or concatenations of literals and other such constants.
func moduleConsts(pkgs []pkgSource, mod string) map[string]map[string]string {
	consts := map[string]map[string]string{}
	type spec struct {
		dir     string
		name    string
		value   ast.Expr
		imports map[string]string
	}
	var specs []spec
	for _, p := range pkgs {
		consts[p.dir] = map[string]string{}
		for _, f := range p.files {
			imports := fileImports(f, mod)
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, s := range g.Specs {
					vs := s.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							specs = append(specs, spec{p.dir, n.Name, vs.Values[i], imports})
						}
					}
				}
			}
		}
	}
	var eval func(e ast.Expr, sp spec) (string, bool)
	eval = func(e ast.Expr, sp spec) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.ParenExpr:
			return eval(e.X, sp)
		case *ast.BinaryExpr:
			if e.Op != token.ADD {
				return "", false
			}
			l, ok1 := eval(e.X, sp)
			r, ok2 := eval(e.Y, sp)
			return l + r, ok1 && ok2
		}
		return constValue(e, sp.dir, sp.imports, consts)
	}
	for changed := true; changed; {
		changed = false
		for _, sp := range specs {
			if _, done := consts[sp.dir][sp.name]; done {
				continue
			}
			if s, ok := eval(sp.value, sp); ok {
				consts[sp.dir][sp.name] = s
				changed = true
			}
		}
	}
	return consts
}
