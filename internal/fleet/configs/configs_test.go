package configs

import (
	"errors"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// The bridge's real check is registered by cmd/myriarchd and tested there
// (cmd/myriarchd/validators_test.go); these tests are about this package's
// part: YAML, the registry, the source handed to a validator.
func TestValidate(t *testing.T) {
	if err := Validate(TypeYAML, "a: 1\nb: [1, 2]\n"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ typ, content, want string }{
		{TypeYAML, "a: [1\n", "content (type yaml): not well-formed YAML"},
		{TypeYAML, "  \n", "content: must not be empty"},
		{TypeBridge, "a: [1\n", "content (type myriarch-bridge): not well-formed YAML"},
		{"json", "{}", `type "json": must be one of myriarch-bridge, yaml`},
	} {
		err := Validate(c.typ, c.content)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q: %v, want %q", c.typ, c.content, err, c.want)
		}
	}
}

// Without a registered validator, a bridge configuration is refused: this
// package must not store what nobody checked. Not parallel: it changes the
// registry.
func TestTypeWithoutRegisteredValidatorIsRefused(t *testing.T) {
	old, _ := validatorOf(TypeBridge)
	t.Cleanup(func() { RegisterValidator(TypeBridge, old) })
	RegisterValidator(TypeBridge, nil)
	err := Validate(TypeBridge, "bridge: {id: b}\n")
	if err == nil || !strings.Contains(err.Error(), "content (type myriarch-bridge): no check for this type is registered") {
		t.Fatalf("unchecked bridge configuration: %v", err)
	}
	// A fake stands in for the bridge's check: the subject is what the
	// registry hands it (the source and the content) and how its refusal
	// is worded, not the bridge's rules.
	var gotSource, gotContent string
	RegisterValidator(TypeBridge, func(source, content string) error {
		gotSource, gotContent = source, content
		return errors.New(source + ":3: routes[0].failover_slo: refused")
	})
	err = ValidateFrom(TypeBridge, "edge.yaml", "bridge: {id: b}\n")
	if err == nil || err.Error() != "content (type myriarch-bridge): edge.yaml:3: routes[0].failover_slo: refused" ||
		gotSource != "edge.yaml" || gotContent != "bridge: {id: b}\n" {
		t.Fatalf("got %v from source %q content %q", err, gotSource, gotContent)
	}
	if err := Validate(TypeBridge, "a: 1\n"); err == nil || gotSource != DefaultSource {
		t.Fatalf("default source %q: %v", gotSource, err)
	}
}

func TestCheckDef(t *testing.T) {
	if err := CheckDef(store.ConfigDef{Name: "edge-eu.1", Type: TypeYAML}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		def  store.ConfigDef
		want string
	}{
		{store.ConfigDef{Name: "Edge", Type: TypeYAML}, `name "Edge": must be 1 to 64 characters`},
		{store.ConfigDef{Name: "-edge", Type: TypeYAML}, `name "-edge"`},
		{store.ConfigDef{Name: "edge", Type: "toml"}, `type "toml"`},
		{store.ConfigDef{Name: "edge", Type: TypeYAML, Priority: 2000000}, "priority 2000000: must be within"},
	} {
		err := CheckDef(c.def)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.def, err, c.want)
		}
	}
}

func TestDiff(t *testing.T) {
	if d := Diff("a", "b", "x\n", "x\n"); d != "" {
		t.Errorf("equal: %q", d)
	}
	a := "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n"
	b := "1\n2\nthree\n4\n5\n6\n7\n8\n9\n10\n11\n12\n13\n"
	want := `--- r1
+++ r2
@@ -1,6 +1,6 @@
 1
 2
-3
+three
 4
 5
 6
@@ -10,3 +10,4 @@
 10
 11
 12
+13
`
	if got := Diff("r1", "r2", a, b); got != want {
		t.Errorf("diff:\n%s\nwant:\n%s", got, want)
	}
	if got := Diff("r1", "r2", "", "new\n"); got != "--- r1\n+++ r2\n@@ -0,0 +1 @@\n+new\n" {
		t.Errorf("from empty: %q", got)
	}
}
