package failover

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
)

// FieldError is a refused configuration value: the field, the value as the
// operator wrote or Myriarch derived it, and the rule it breaks.
type FieldError struct {
	Field string
	Value string
	Rule  string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Field, e.Value, e.Rule)
}

func fieldErr(field string, value any, rule string, args ...any) *FieldError {
	return &FieldError{Field: field, Value: fmt.Sprint(value), Rule: fmt.Sprintf(rule, args...)}
}

// Errs flattens an error built with errors.Join into its parts, so that
// callers can list every problem, one per line.
func Errs(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Errs(e)...)
		}
		return out
	}
	return []error{err}
}

// RenameWords replaces in s every whole word that names maps (a library
// field name such as LeaseTTL) by the caller's key: for the warnings and
// rules that mention fields by name.
func RenameWords(s string, names map[string]string) string {
	if len(names) == 0 {
		return s
	}
	return wordPattern.ReplaceAllStringFunc(s, func(w string) string {
		if k, ok := names[w]; ok {
			return k
		}
		return w
	})
}

// wordPattern matches the identifiers that RenameWords looks up.
var wordPattern = regexp.MustCompile(`\b[A-Za-z][A-Za-z0-9_]*\b`)

// ErrorStrings returns the messages of every part of err.
func ErrorStrings(err error) []string {
	parts := Errs(err)
	out := make([]string, 0, len(parts))
	for _, e := range parts {
		out = append(out, e.Error())
	}
	return out
}

// RenameFields returns err with the Field of every FieldError part, and
// the field names its Rule mentions, renamed through names (library field
// → the caller's config key), so that a daemon reports the library's
// refusals in its own vocabulary. Other parts (also wrapped FieldErrors),
// and fields not in names, are kept as they are.
func RenameFields(err error, names map[string]string) error {
	parts := Errs(err)
	if len(parts) == 0 {
		return nil
	}
	out := make([]error, 0, len(parts))
	for _, e := range parts {
		if fe, ok := e.(*FieldError); ok {
			c := *fe
			c.Field = cmp.Or(names[fe.Field], fe.Field)
			c.Rule = RenameWords(c.Rule, names)
			e = &c
		}
		out = append(out, e)
	}
	if len(out) == 1 {
		return out[0]
	}
	return errors.Join(out...)
}
