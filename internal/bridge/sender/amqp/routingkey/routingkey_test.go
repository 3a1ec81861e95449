package routingkey

import (
	"strings"
	"testing"
)

func TestTemplate(t *testing.T) {
	for _, c := range []struct{ tmpl, topic, want string }{
		{"{topic}", "site/a/temp", "site.a.temp"},
		{"{topic}", "/lead", ".lead"},
		{"mqtt.{topic}", "a/b", "mqtt.a.b"},
		{"{topic_raw}", "a/b", "a/b"},
		{"q-fixed", "a/b", "q-fixed"},
		{"", "a/b", ""},
		{"x.{topic}.{topic_raw}", "a/b", "x.a.b.a/b"},
	} {
		tp, err := Parse(c.tmpl)
		if err != nil {
			t.Fatalf("%q: %v", c.tmpl, err)
		}
		if got := tp.Key(c.topic); got != c.want {
			t.Errorf("%q on %q = %q, want %q", c.tmpl, c.topic, got, c.want)
		}
	}
	for _, c := range []struct{ tmpl, says string }{
		{"{topic", "without its '}'"},
		{"topic}", "closes no placeholder"},
		{"{queue}", "unknown placeholder {queue}"},
		{"{{topic}}", "without its '}'"},
		{strings.Repeat("k", 256), "above AMQP's 255"},
	} {
		_, err := Parse(c.tmpl)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q: %v, want an error saying %q", c.tmpl, err, c.says)
		}
	}
}

// FuzzTemplate: any string either parses or is refused with an error,
// never a panic; a parsed template renders a key that keeps its literal
// text, and one without braces renders itself.
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{"{topic}", "a.{topic_raw}.b", "{", "}", "{}", "{{topic}}", "x{topic}y{topic}", ""} {
		f.Add(s, "a/b/c")
	}
	f.Fuzz(func(t *testing.T, tmpl, topic string) {
		tp, err := Parse(tmpl)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		key := tp.Key(topic)
		if !strings.ContainsAny(tmpl, "{}") && key != tmpl {
			t.Fatalf("literal %q rendered %q", tmpl, key)
		}
		lit := strings.NewReplacer("{topic}", "", "{topic_raw}", "").Replace(tmpl)
		if len(key) < len(lit) {
			t.Fatalf("%q rendered %q, shorter than its literal text", tmpl, key)
		}
		if !strings.Contains(tmpl, "{topic_raw}") && strings.Contains(topic, "/") && strings.Contains(key, "/") && !strings.Contains(lit, "/") {
			t.Fatalf("%q on %q kept a '/': %q", tmpl, topic, key)
		}
	})
}
