// Package routingkey renders the AMQP sender's routing keys from MQTT topics.
// It is a leaf of its own so that the configuration can check a template
// without linking the AMQP client.
package routingkey

import (
	"fmt"
	"strings"
)

// Max is the longest routing key AMQP 0.9.1 carries (a short
// string).
const Max = 255

// Template is a parsed routing key template: literal text and the
// placeholders {topic} (the MQTT topic with every '/' turned into '.', the
// word separator of AMQP topic exchanges) and {topic_raw} (the topic as
// is). A template without placeholders is a fixed key (e.g. a queue name
// on the default exchange).
type Template struct {
	parts []part
	set   bool // parsed (the zero Template is unset)
}

// IsZero reports whether t was never parsed.
func (t Template) IsZero() bool { return !t.set }

type part struct {
	lit string
	// ph is "" for a literal part, else the placeholder's name.
	ph string
}

// Placeholders are the names a template may use, in the docs' order.
var Placeholders = []string{"topic", "topic_raw"}

// Default is the routing key template when none is configured.
const Default = "{topic}"

// Parse parses s. Braces only open and close a placeholder; a
// literal brace cannot be written (AMQP routing keys rarely need one).
func Parse(s string) (Template, error) {
	t := Template{set: true}
	rest := s
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.parts = append(t.parts, part{lit: rest})
			break
		}
		if rest[i] == '}' {
			return Template{}, fmt.Errorf("has a '}' at byte %d that closes no placeholder", len(s)-len(rest)+i)
		}
		if i > 0 {
			t.parts = append(t.parts, part{lit: rest[:i]})
		}
		j := strings.IndexAny(rest[i+1:], "{}")
		if j < 0 || rest[i+1+j] != '}' {
			return Template{}, fmt.Errorf("has a '{' at byte %d without its '}'", len(s)-len(rest)+i)
		}
		name := rest[i+1 : i+1+j]
		known := false
		for _, p := range Placeholders {
			known = known || p == name
		}
		if !known {
			return Template{}, fmt.Errorf("has an unknown placeholder {%s} (known: {topic}, {topic_raw})", name)
		}
		t.parts = append(t.parts, part{ph: name})
		rest = rest[i+1+j+1:]
	}
	if len(t.parts) == 0 {
		// The empty key: valid (fanout exchanges ignore it).
		return t, nil
	}
	if fixed, ok := t.fixed(); ok && len(fixed) > Max {
		return Template{}, fmt.Errorf("is %d bytes long, above AMQP's %d", len(fixed), Max)
	}
	return t, nil
}

// MustParse is Parse for a template known to be valid.
func MustParse(s string) Template {
	t, err := Parse(s)
	if err != nil {
		panic("amqp routing key template " + s + ": " + err.Error())
	}
	return t
}

func (t Template) fixed() (string, bool) {
	var b strings.Builder
	for _, p := range t.parts {
		if p.ph != "" {
			return "", false
		}
		b.WriteString(p.lit)
	}
	return b.String(), true
}

// Key renders the routing key of a message on topic.
func (t Template) Key(topic string) string {
	if len(t.parts) == 1 && t.parts[0].ph == "topic" {
		return dotted(topic)
	}
	var b strings.Builder
	for _, p := range t.parts {
		switch p.ph {
		case "":
			b.WriteString(p.lit)
		case "topic":
			b.WriteString(dotted(topic))
		case "topic_raw":
			b.WriteString(topic)
		}
	}
	return b.String()
}

// dotted maps the MQTT topic levels onto AMQP topic-exchange words: each
// '/' becomes '.'. Nothing else changes: MQTT's wildcards cannot occur in
// a published topic, and AMQP's ('*', '#') only mean something in
// binding keys.
func dotted(topic string) string { return strings.ReplaceAll(topic, "/", ".") }
