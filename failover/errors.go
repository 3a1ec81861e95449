package failover

import (
	"errors"
	"fmt"
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

// ErrorStrings returns the messages of every part of err.
func ErrorStrings(err error) []string {
	parts := Errs(err)
	out := make([]string, 0, len(parts))
	for _, e := range parts {
		out = append(out, e.Error())
	}
	return out
}

// RenameFields returns err with the Field of every FieldError part
// renamed through names (library field → the caller's config key), so
// that a daemon reports the library's refusals in its own vocabulary.
// Other parts (also wrapped FieldErrors), and fields not in names, are
// kept as they are.
func RenameFields(err error, names map[string]string) error {
	parts := Errs(err)
	if len(parts) == 0 {
		return nil
	}
	out := make([]error, 0, len(parts))
	for _, e := range parts {
		if fe, ok := e.(*FieldError); ok {
			if key, ok := names[fe.Field]; ok {
				c := *fe
				c.Field = key
				e = &c
			}
		}
		out = append(out, e)
	}
	if len(out) == 1 {
		return out[0]
	}
	return errors.Join(out...)
}
