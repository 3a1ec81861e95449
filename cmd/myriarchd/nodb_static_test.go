package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// dbOpeners are the calls that open the database (or start a replica,
// which does).
var dbOpeners = []string{"store.Open", "daemon.Start", "devdb.Start", "pgxpool.New", "pgxpool.NewWithConfig", "pgx.Connect", "pgx.ConnectConfig"}

// dbReach finds, in the files of package main, the command steps that
// reach a call of dbOpeners through the package's own functions: the Run
// function of every cli.Command whose Name is a literal, the run step of
// every apiCmd literal, and every function of a map literal keyed by a
// subcommand (registerGroup's local commands). It returns root → the
// path of calls to the opener. Calls through function values it cannot
// see are the dynamic test's (TestAPICommandsNeverOpenTheDatabase).
func dbReach(fset *token.FileSet, files []*ast.File) map[string]string {
	funcs := map[string][]*ast.FuncDecl{} // by name; methods by method name
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				funcs[fd.Name.Name] = append(funcs[fd.Name.Name], fd)
			}
		}
	}
	// path returns the call path from n to an opener, or "".
	var path func(n ast.Node, seen map[string]bool) string
	path = func(n ast.Node, seen map[string]bool) string {
		found := ""
		ast.Inspect(n, func(x ast.Node) bool {
			if found != "" {
				return false
			}
			call, ok := x.(*ast.CallExpr)
			if !ok {
				return true
			}
			var name string
			switch fn := call.Fun.(type) {
			case *ast.Ident:
				name = fn.Name
			case *ast.SelectorExpr:
				if pkg, ok := fn.X.(*ast.Ident); ok && slices.Contains(dbOpeners, pkg.Name+"."+fn.Sel.Name) {
					found = pkg.Name + "." + fn.Sel.Name
					return false
				}
				name = fn.Sel.Name
			}
			if name == "" || seen[name] {
				return true
			}
			seen[name] = true
			for _, fd := range funcs[name] {
				if fd.Body == nil {
					continue
				}
				if p := path(fd.Body, seen); p != "" {
					found = name + " → " + p
					return false
				}
			}
			return true
		})
		return found
	}
	out := map[string]string{}
	root := func(label string, n ast.Node) {
		if p := path(n, map[string]bool{}); p != "" {
			out[label] = p
		}
	}
	// The path every API command takes, whatever its step.
	for _, name := range []string{"runAPI", "registerGroup"} {
		for _, fd := range funcs[name] {
			root("(every API command) "+name, fd.Body)
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(x ast.Node) bool {
			lit, ok := x.(*ast.CompositeLit)
			if !ok {
				return true
			}
			switch typeName(lit.Type) {
			case "cli.Command":
				name, run := field(lit, "Name"), field(lit, "Run")
				if s, ok := stringLit(name); ok && run != nil {
					root(s, resolve(run, funcs))
				}
			case "apiCmd":
				g, _ := stringLit(field(lit, "group"))
				n, ok := stringLit(field(lit, "name"))
				if !ok {
					n = "<" + fset.Position(lit.Pos()).String() + ">"
				}
				if run := field(lit, "run"); run != nil {
					root(strings.TrimSpace(g+" "+n), run)
				}
			}
			if mt, ok := lit.Type.(*ast.MapType); ok && typeName(mt.Key) == "string" {
				if _, ok := mt.Value.(*ast.FuncType); ok {
					for _, e := range lit.Elts {
						kv := e.(*ast.KeyValueExpr)
						if s, ok := stringLit(kv.Key); ok {
							root("(local) "+s, resolve(kv.Value, funcs))
						}
					}
				}
			}
			return true
		})
	}
	return out
}

func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.SelectorExpr:
		if p, ok := t.X.(*ast.Ident); ok {
			return p.Name + "." + t.Sel.Name
		}
	}
	return ""
}

func field(lit *ast.CompositeLit, name string) ast.Expr {
	for _, e := range lit.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if k, ok := kv.Key.(*ast.Ident); ok && k.Name == name {
				return kv.Value
			}
		}
	}
	return nil
}

func stringLit(e ast.Expr) (string, bool) {
	b, ok := e.(*ast.BasicLit)
	if !ok || b.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(b.Value)
	return s, err == nil
}

// resolve is the body of the function that e names, or e itself.
func resolve(e ast.Expr, funcs map[string][]*ast.FuncDecl) ast.Node {
	if id, ok := e.(*ast.Ident); ok && len(funcs[id.Name]) == 1 {
		return funcs[id.Name][0].Body
	}
	return e
}

func parseDir(t *testing.T, fset *token.FileSet, dir string) []*ast.File {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// TestOnlyAllowedCommandsReachTheDatabaseStatically: in the source of
// this program, only serve, migrate and token bootstrap reach a function
// that opens the database; a planted command that does, through a
// helper, is reported with its path.
func TestOnlyAllowedCommandsReachTheDatabaseStatically(t *testing.T) {
	fset := token.NewFileSet()
	reach := dbReach(fset, parseDir(t, fset, "."))
	for root, p := range reach {
		allowed := slices.Contains(dbCommands, root) || root == "(local) bootstrap"
		if !allowed {
			t.Errorf("command %q reaches the database: %s", root, p)
		}
	}
	for _, want := range []string{"serve", "migrate", "(local) bootstrap"} {
		if _, ok := reach[want]; !ok {
			t.Errorf("%s does not reach the database: the check went blind (found %v)", want, reach)
		}
	}

	planted := `package main
func init() {
	apiCommands = append(apiCommands, apiCmd{group: "config", name: "list", run: func() { listFromDB() }})
	commands.Register(cli.Command{Name: "audit", Run: runAudit})
}
func listFromDB() { openDB() }
func openDB() { st, _ := store.Open(ctx, url, 2, nil); _ = st }
func runAudit(args []string) int { return 0 }
`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "planted.go"), []byte(planted), 0o600); err != nil {
		t.Fatal(err)
	}
	pf := token.NewFileSet()
	got := dbReach(pf, parseDir(t, pf, dir))
	if got["config list"] != "listFromDB → openDB → store.Open" || len(got) != 1 {
		t.Fatalf("planted violation: %v", got)
	}
}
