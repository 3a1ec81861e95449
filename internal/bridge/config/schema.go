package config

// The schema of the configuration file: one Table per kind of YAML object,
// one Row per key. A row states the key's type, its default, the simple rule
// that its value must follow (required, one of a set, a range, a format) and
// what it means. The rows drive three things, so that none of them can drift
// from the others:
//
//   - the walk over the YAML document, which refuses unknown keys and names
//     the keys that the object accepts (walk in load.go);
//   - the value of each key with its default applied, after its row's rule
//     was checked (resolve below);
//   - the configuration reference in docs/bridge.md (MarkdownTable).
//
// Rules that relate several keys or objects (a session's mode and its
// client_id, the activation bound, the admission of the failover budgets,
// loop pairs, what MQTT 3.1.1 cannot carry) are code in validate.go; they
// run on the resolved values.

import (
	"fmt"
	"math"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/sender/amqp/routingkey"
	"github.com/myriarch/myriarch/internal/godur"
)

// Kind is the YAML type of a key's value.
type Kind string

// The kinds of value.
const (
	String    Kind = "string"
	Duration  Kind = "duration"
	Int       Kind = "integer"
	Number    Kind = "number"
	Bool      Kind = "boolean"
	Strings   Kind = "list of strings"
	StringMap Kind = "map of strings"
	Object    Kind = "mapping"
	Objects   Kind = "list of mappings"
)

// Row is one key of a YAML object.
type Row struct {
	// Key is the key inside its object; a key of a nested mapping is
	// dotted (http.listen is the key listen of the mapping http).
	Key  string
	Kind Kind
	// Default is the value taken when the key is omitted, as it would be
	// written in YAML; "" is the zero value.
	Default string
	// DefaultDoc describes a default that depends on other keys; the docs
	// show it instead of Default, and the code in validate.go applies it.
	DefaultDoc string
	Rule       Rule
	Meaning    string
	// Table is the schema of a mapping, or of each mapping of a list.
	Table *Table
	// To is where the resolved value goes in the Go value that the table
	// resolves into (to, with, opt, orWritten, verbatim); nil for a key that the
	// code copies from the raw object as written, or that only its rule
	// concerns.
	To *dest
	// ExclusiveOnly marks a route key of an exclusive session's lease
	// policy: it is refused on a route of any other session.
	ExclusiveOnly bool
}

// Rule is the check of one value that needs nothing but the value.
type Rule struct {
	// Required is the problem reported when the key is omitted or empty;
	// "" makes the key optional.
	Required string
	// OneOf lists the accepted values (of a string or an integer).
	OneOf []string
	// Min and Max bound an integer, a number or a duration, written as
	// in YAML; "" is unbounded.
	Min, Max string
	// Positive refuses a duration of zero.
	Positive bool
	// Whole requires a duration of whole seconds.
	Whole bool
	// ZeroOK exempts a duration of zero from Min, Max and Whole (it
	// disables the feature).
	ZeroOK bool
	// Format names a check of a string's form, each element's for a list
	// (see formats).
	Format string
	// Says replaces the generated text of the rule, in problems and docs.
	Says string
}

// Table is the schema of one kind of YAML object.
type Table struct {
	// Name is how problems name the object: "the top level", or its path.
	Name string
	Rows []Row
	// SenderType is the sender type whose block this table is ("" when it
	// is not a sender block).
	SenderType string
}

// format is the check behind a Rule.Format: the rule broken, or "".
type format struct {
	doc   string
	check func(string) string
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

const idRule = "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"

var formats = map[string]format{
	"id": {"1-128 letters, digits, `.`, `_` or `-`, starting with a letter or digit", func(s string) string {
		if !idPattern.MatchString(s) {
			return idRule
		}
		return ""
	}},
	"mqtt-url": {"a `tcp://`, `mqtt://`, `ssl://`, `tls://` or `mqtts://` URL with a port", brokerURLRule},
	"http-url": {"an `http://` or `https://` URL", func(s string) string {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "must be an http:// or https:// URL"
		}
		return ""
	}},
	"nats-url": {"a `nats://` or `tls://` URL", func(s string) string {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" {
			return "must be a nats:// or tls:// URL"
		}
		return ""
	}},
	"amqp-url": {"an `amqp://` or `amqps://` URL", func(s string) string {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
			return "must be an amqp:// or amqps:// URL"
		}
		return ""
	}},
	"routing-key": {"a routing key template (`{topic}`, `{topic_raw}` and literal text)", func(s string) string {
		if _, err := routingkey.Parse(s); err != nil {
			return "must be a routing key template: it " + err.Error()
		}
		return ""
	}},
	"listen": {"`host:port`, `:port` or `off`", func(s string) string {
		if s == "off" {
			return ""
		}
		if _, _, err := splitHostPort(s); err != nil {
			return `must be host:port, :port or "off"`
		}
		return ""
	}},
	"filter": {"an MQTT topic filter; `$share/<group>/<filter>` is allowed", validFilter},
	"topic-prefix": {"a topic prefix without MQTT wildcards", func(s string) string {
		if strings.ContainsAny(s, "+#") {
			return "must not contain MQTT wildcards"
		}
		return ""
	}},
}

func brokerURLRule(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "must be a URL such as tcp://host:1883, ssl://host:8883 or mqtts://host:8883"
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts":
	default:
		return "scheme must be tcp, mqtt, ssl, tls or mqtts"
	}
	if u.Port() == "" {
		return "must name a port"
	}
	return ""
}

// child returns what key names in an object of this table: its row, or the
// table of a nested mapping written as dotted rows (http for http.listen).
func (t *Table) child(key, path string) (*Row, *Table, bool) {
	for i := range t.Rows {
		if t.Rows[i].Key == key {
			return &t.Rows[i], t.Rows[i].Table, true
		}
	}
	sub := &Table{Name: path}
	for _, r := range t.Rows {
		if rest, ok := strings.CutPrefix(r.Key, key+"."); ok {
			r.Key = rest
			sub.Rows = append(sub.Rows, r)
		}
	}
	return nil, sub, len(sub.Rows) > 0
}

// keys lists the keys that an object of this table accepts, sorted.
func (t *Table) keys() []string {
	var ks []string
	for _, r := range t.Rows {
		k, _, _ := strings.Cut(r.Key, ".")
		if !slices.Contains(ks, k) {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// text is the rule in words, as the docs state it.
func (r *Row) text() string {
	if r.Rule.Says != "" {
		return r.Rule.Says
	}
	var parts []string
	if len(r.Rule.OneOf) > 0 {
		parts = append(parts, r.oneOfText())
	}
	if f, ok := formats[r.Rule.Format]; ok {
		parts = append(parts, "must be "+f.doc)
	}
	if r.Rule.Min != "" || r.Rule.Max != "" {
		parts = append(parts, r.rangeText())
	}
	if r.Kind == Duration {
		switch {
		case r.Rule.Positive:
			parts = append(parts, "must be a positive duration")
		case r.Rule.Min == "":
			parts = append(parts, "must not be negative")
		}
		if r.Rule.Whole {
			parts = append(parts, wholeRule)
		}
	}
	return strings.Join(parts, "; ")
}

const wholeRule = "must be whole seconds (MQTT carries seconds)"

// oneOfText is the problem of a value outside OneOf.
func (r *Row) oneOfText() string {
	if r.Rule.Says != "" {
		return r.Rule.Says
	}
	return "must be " + orList(r.Rule.OneOf)
}

// rangeText is the problem of a value outside [Min, Max].
func (r *Row) rangeText() string {
	u := r.Rule
	switch {
	case u.Says != "":
		return u.Says
	case u.Min != "" && u.Max != "":
		return fmt.Sprintf("must be within [%s, %s]", r.bound(u.Min), r.bound(u.Max))
	case u.Min == "0":
		return "must not be negative"
	case u.Min != "":
		return "must be at least " + r.bound(u.Min)
	}
	return "must be at most " + r.bound(u.Max)
}

// bound prints a Min or Max as the problems do (a duration in Go's form).
func (r *Row) bound(s string) string {
	if r.Kind == Duration {
		d, _ := time.ParseDuration(s)
		return d.String()
	}
	return s
}

func orList(xs []string) string {
	if len(xs) == 1 {
		return xs[0]
	}
	return strings.Join(xs[:len(xs)-1], ", ") + " or " + xs[len(xs)-1]
}

// dest is where a row's resolved value goes: a field of the Go value that
// its table resolves into, reached by a typed function, so that a
// destination that does not exist does not compile. checkTables (run at
// init) holds its Go type to the row's Kind and the rows of one table to
// one destination type.
type dest struct {
	obj reflect.Type // *D, the destination of the table
	val reflect.Type // the Go type of the value
	// put stores the value: val is the resolved value (the default where
	// omitted or refused), raw the value in the raw object (nil when an
	// enclosing mapping is absent), written whether the file has it (see
	// rawValue), accepted whether it was written and passed its rule.
	put func(obj, val, raw any, written, accepted bool)
}

// to stores the resolved value (the default where omitted or refused) in
// the field that field returns.
func to[D, T any](field func(*D) *T) *dest {
	return &dest{obj: reflect.TypeFor[*D](), val: reflect.TypeFor[T](), put: func(o, v, _ any, _, _ bool) {
		x, _ := v.(T)
		*field(o.(*D)) = x
	}}
}

// with passes the resolved value to set, for a field whose Go type is not
// the value's own (a QoS byte, a parsed mode).
func with[D, T any](set func(*D, T)) *dest {
	return &dest{obj: reflect.TypeFor[*D](), val: reflect.TypeFor[T](), put: func(o, v, _ any, _, _ bool) {
		x, _ := v.(T)
		set(o.(*D), x)
	}}
}

// opt points the field that field returns at the value when it was written
// and accepted, and leaves it nil otherwise: for a key whose default the
// code applies (its row has a DefaultDoc).
func opt[D, T any](field func(*D) **T) *dest {
	return &dest{obj: reflect.TypeFor[*D](), val: reflect.TypeFor[T](), put: func(o, v, _ any, _, accepted bool) {
		if x, ok := v.(T); ok && accepted {
			*field(o.(*D)) = &x
		}
	}}
}

// orWritten is to, except that a refused value is stored as written: none
// of the rules that depend on the key apply to it.
func orWritten[D, T any](field func(*D) *T) *dest {
	return &dest{obj: reflect.TypeFor[*D](), val: reflect.TypeFor[T](), put: func(o, v, raw any, written, accepted bool) {
		if written && !accepted {
			v = raw
		}
		x, _ := v.(T)
		*field(o.(*D)) = x
	}}
}

// verbatim stores the value as the raw object has it, blank or refused:
// for a key that the code takes as written (an id, a URL, a list of
// names) and whose rule only reports.
func verbatim[D, T any](field func(*D) *T) *dest {
	return &dest{obj: reflect.TypeFor[*D](), val: reflect.TypeFor[T](), put: func(o, _, raw any, _, _ bool) {
		x, _ := raw.(T)
		*field(o.(*D)) = x
	}}
}

// goTypes is the Go type of the value of each kind.
var goTypes = map[Kind]reflect.Type{
	String: reflect.TypeFor[string](), Duration: reflect.TypeFor[time.Duration](), Int: reflect.TypeFor[int](),
	Number: reflect.TypeFor[float64](), Bool: reflect.TypeFor[bool](), Strings: reflect.TypeFor[[]string](),
	StringMap: reflect.TypeFor[map[string]string](),
}

// checkTables checks the destinations of the rows of every table reachable
// from t: each holds the Go type of its row's Kind, and the rows of one
// table share one destination type.
func checkTables(t *Table, seen map[*Table]bool) error {
	if seen[t] {
		return nil
	}
	seen[t] = true
	var obj reflect.Type
	for _, r := range t.Rows {
		if r.Table != nil {
			if err := checkTables(r.Table, seen); err != nil {
				return err
			}
		}
		if r.To == nil {
			continue
		}
		if want := goTypes[r.Kind]; r.To.val != want {
			return fmt.Errorf("config: %s.%s: the row of kind %s stores a %v, not a %v", t.Name, r.Key, r.Kind, r.To.val, want)
		}
		if obj != nil && r.To.obj != obj {
			return fmt.Errorf("config: %s.%s: stores into %v, the other rows of the table into %v", t.Name, r.Key, r.To.obj, obj)
		}
		obj = r.To.obj
	}
	return nil
}

func init() {
	if err := checkTables(&topTable, map[*Table]bool{}); err != nil {
		panic(err)
	}
}

// values is how the keys of one object resolved: each checked against its
// row, with its default applied where it was omitted or refused. The code
// asks by row, for the few rules that relate keys; the values themselves
// went to the rows' destinations.
type values struct {
	t   *Table
	val []any  // resolved: the default where omitted or refused
	raw []any  // as written
	set []bool // written in the file
	bad []bool // written and refused, or required and omitted
}

// index is the position of r in the table; a row of another table is a
// programming error.
func (vs values) index(r *Row) int {
	for i := range vs.t.Rows {
		if &vs.t.Rows[i] == r {
			return i
		}
	}
	panic(fmt.Sprintf("config: table %s has no row %q", vs.t.Name, r.Key))
}

// given reports whether r's key was written in the file.
func (vs values) given(r *Row) bool { return vs.set[vs.index(r)] }

// accepted reports whether r's key was written and passed its row's rule.
func (vs values) accepted(r *Row) bool { i := vs.index(r); return vs.set[i] && !vs.bad[i] }

// value is the resolved value of r's key.
func (vs values) value(r *Row) any { return vs.val[vs.index(r)] }

// written is the value of r's key as the file has it.
func (vs values) written(r *Row) any { return vs.raw[vs.index(r)] }

// resolve checks every value row of t against obj, the decoded raw object
// at path prefix (a pointer or struct of raw.go), stores each value at its
// row's destination in dst (a pointer to the Go value the table resolves
// into; nil for a table without destinations) and returns the values.
func (v *validator) resolve(prefix string, t *Table, obj, dst any) values {
	n := len(t.Rows)
	vs := values{t: t, val: make([]any, n), raw: make([]any, n), set: make([]bool, n), bad: make([]bool, n)}
	rv := reflect.ValueOf(obj)
	for i := range t.Rows {
		r := &t.Rows[i]
		path := join(prefix, r.Key)
		f, present := lookup(rv, r.Key)
		written, raw := rawValue(f, present)
		vs.set[i] = written
		vs.raw[i] = raw
		def := r.defaultValue()
		if !written {
			vs.val[i] = def
			if r.Rule.Required != "" {
				v.add(path, nil, "%s", r.Rule.Required)
				vs.bad[i] = true
			}
			r.store(dst, def, raw, false, false)
			continue
		}
		val, rule := r.check(raw)
		if rule == "" && r.Kind == Strings && r.Rule.Format != "" {
			for j, s := range raw.([]string) {
				if why := formats[r.Rule.Format].check(s); why != "" {
					v.add(fmt.Sprintf("%s[%d]", path, j), s, "%s", why)
					vs.bad[i] = true
				}
			}
		}
		if rule != "" {
			v.add(path, raw, "%s", rule)
			vs.bad[i] = true
			val = def
		}
		vs.val[i] = val
		r.store(dst, val, raw, true, !vs.bad[i])
	}
	return vs
}

// store puts a value at the row's destination in dst.
func (r *Row) store(dst, val, raw any, written, accepted bool) {
	if r.To == nil {
		return
	}
	if dst == nil || reflect.TypeOf(dst) != r.To.obj {
		panic(fmt.Sprintf("config: row %q stores into %v, resolved into %T", r.Key, r.To.obj, dst))
	}
	r.To.put(dst, val, raw, written, accepted)
}

// defaultValue is Default parsed as the row's kind.
func (r *Row) defaultValue() any {
	switch r.Kind {
	case String:
		return r.Default
	case Duration:
		d, _ := time.ParseDuration(r.Default)
		return d
	case Int:
		n, _ := strconv.Atoi(r.Default)
		return n
	case Number:
		f, _ := strconv.ParseFloat(r.Default, 64)
		return f
	case Bool:
		return r.Default == "true"
	}
	return nil
}

// check applies the row's rule to a written value and returns the value
// in its Go type, or the rule it breaks.
func (r *Row) check(raw any) (any, string) {
	u := r.Rule
	switch r.Kind {
	case String:
		s := raw.(string)
		if len(u.OneOf) > 0 {
			s = strings.TrimSpace(s)
			if !slices.Contains(u.OneOf, s) {
				return nil, r.oneOfText()
			}
		}
		if f, ok := formats[u.Format]; ok {
			if why := f.check(s); why != "" {
				return nil, why
			}
		}
		return s, ""
	case Duration:
		d, err := godur.Parse(raw.(string))
		switch {
		case err != nil:
			return nil, godur.Rule
		case d < 0:
			return nil, "must not be negative"
		case d == 0 && u.Positive:
			return nil, "must be a positive duration"
		case d == 0 && u.ZeroOK:
			return d, ""
		}
		lo, _ := time.ParseDuration(u.Min)
		hi, _ := time.ParseDuration(u.Max)
		if (u.Min != "" && d < lo) || (u.Max != "" && d > hi) {
			return nil, r.rangeText()
		}
		if u.Whole && d%time.Second != 0 {
			if u.Says != "" {
				return nil, u.Says
			}
			return nil, wholeRule
		}
		return d, ""
	case Int:
		n := raw.(int)
		if len(u.OneOf) > 0 && !slices.Contains(u.OneOf, strconv.Itoa(n)) {
			return nil, r.oneOfText()
		}
		lo, _ := strconv.Atoi(u.Min)
		hi, _ := strconv.Atoi(u.Max)
		if (u.Min != "" && n < lo) || (u.Max != "" && n > hi) {
			return nil, r.rangeText()
		}
		return n, ""
	case Number:
		f := raw.(float64)
		lo, _ := strconv.ParseFloat(u.Min, 64)
		hi, _ := strconv.ParseFloat(u.Max, 64)
		if math.IsNaN(f) || math.IsInf(f, 0) || (u.Min != "" && f < lo) || (u.Max != "" && f > hi) {
			return nil, r.rangeText()
		}
		return f, ""
	}
	return raw, ""
}

// lookup finds the field of a dotted key in a raw object by its YAML tag;
// a nil pointer on the way means the key is absent.
func lookup(v reflect.Value, key string) (reflect.Value, bool) {
	for part := range strings.SplitSeq(key, ".") {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		i := fieldIndex(v.Type(), part)
		if i == nil {
			panic(fmt.Sprintf("config: %s has no field tagged %q", v.Type(), part))
		}
		v = v.FieldByIndex(i)
	}
	return v, true
}

// fieldIndex is the index path of the field tagged tag, also inside an
// embedded struct tagged ",inline" (LeaseKeys); nil when there is none.
func fieldIndex(t reflect.Type, tag string) []int {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == tag && tag != "" {
			return []int{i}
		}
		if name == "" && opts == "inline" && f.Type.Kind() == reflect.Struct {
			if sub := fieldIndex(f.Type, tag); sub != nil {
				return append([]int{i}, sub...)
			}
		}
	}
	return nil
}

// yamlTags lists the keys of a raw type, those of its inline structs
// included.
func yamlTags(t reflect.Type) []string {
	var tags []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case name == "" && opts == "inline":
			tags = append(tags, yamlTags(f.Type)...)
		case name != "" && name != "-":
			tags = append(tags, name)
		}
	}
	return tags
}

// rawValue reports whether a raw field was written and its value: a
// string, an int, a float64, a bool, a []string or a map[string]string.
// An empty string, a zero int or float, an empty list count as omitted
// (the raw types use pointers where zero is a value of its own).
func rawValue(f reflect.Value, present bool) (bool, any) {
	if !present {
		return false, nil
	}
	if f.Kind() == reflect.Pointer {
		if f.IsNil() {
			return false, nil
		}
		if f.Elem().Kind() == reflect.Struct {
			return true, nil
		}
		f = f.Elem()
		return true, f.Interface()
	}
	switch f.Kind() {
	case reflect.String:
		return strings.TrimSpace(f.String()) != "", f.String()
	case reflect.Int:
		return f.Int() != 0, int(f.Int())
	case reflect.Float64:
		return f.Float() != 0, f.Float()
	case reflect.Bool:
		return f.Bool(), f.Bool()
	case reflect.Slice, reflect.Map:
		return f.Len() > 0, f.Interface()
	}
	return true, nil
}
