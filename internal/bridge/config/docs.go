package config

import (
	"fmt"
	"strings"
)

// Reference names the tables of the configuration reference in
// docs/bridge.md, in the doc's order; each is the generated block
// bridge-config-NAME (internal/docgen).
var Reference = []struct {
	Name  string
	Table *Table
}{
	{"bridge", &bridgeTable},
	{"lease-store", &leaseStoreTable},
	{"sessions", &sessionTable},
	{"tls", &tlsTable},
	{"receivers", &receiverTable},
	{"topics", &topicTable},
	{"senders", &senderTable},
	{"sender-mqtt", &mqttSenderTable},
	{"sender-http", &httpSenderTable},
	{"sender-nats", &natsSenderTable},
	{"sender-kafka", &kafkaSenderTable},
	{"sender-file", &fileSenderTable},
	{"sender-amqp", &amqpSenderTable},
	{"sender-sqs", &sqsSenderTable},
	{"routes", &routeTable},
	{"mappings", &mappingTable},
	{"spool", &spoolTable},
	{"opamp", &opampTable},
}

// MarkdownTable renders the rows of t as the reference table of its YAML
// object: key, type, default, accepted values, meaning.
func MarkdownTable(t *Table) string {
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Accepted | Meaning |\n|---|---|---|---|---|\n")
	for _, r := range t.Rows {
		def := "none"
		switch {
		case r.Rule.Required != "":
			def = "required"
		case r.DefaultDoc != "":
			def = r.DefaultDoc
		case r.Default != "":
			def = "`" + r.Default + "`"
		}
		rule := r.text()
		if rule == "" {
			rule = "any"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", r.Key, r.Kind, def, cell(rule), r.Meaning)
	}
	return b.String()
}

// cell keeps a rule's text inside its table cell.
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}
