package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/deadletter"
	"github.com/myriarch/myriarch/internal/bridge/deadletter/replay"
	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/godur"
)

func init() {
	commands.Register(cli.Command{
		Name:    "deadletter",
		Summary: "list, inspect and replay dead-lettered messages",
		Run:     runDeadLetter,
	})
}

// Exit statuses of deadletter besides 0 and cli.ExitUsage: a record not
// found, a replay with failed or unknown sends, a file that cannot be read.
const exitDLFailed = 1

const deadLetterUsage = `usage:
  myriarch-bridge deadletter list    (-c FILE | --file DEADLETTERS) [filters] [-o table|json]
  myriarch-bridge deadletter inspect (-c FILE | --file DEADLETTERS) (ID | --id ID | --line N | --offset N) [--payload auto|text|hex|raw] [-o text|json]
  myriarch-bridge deadletter replay  -c FILE (--route ROUTE | --sender SENDER) [filters] [--dry-run] [--rate N] [--again] [--force] [--keep-retain]

filters: --route ROUTE (replay: --from-route), --sender SENDER (list), --topic FILTER, --since T, --until T,
         --reason TEXT, --id ID (repeatable); T is RFC 3339 or a duration before now (2h)`

func runDeadLetter(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, deadLetterUsage)
		return cli.ExitUsage
	}
	switch args[0] {
	case "list":
		return dlList(args[1:], stdout, stderr)
	case "inspect":
		return dlInspect(args[1:], stdout, stderr)
	case "replay":
		return dlReplay(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, deadLetterUsage)
		return 0
	}
	fmt.Fprintf(stderr, "myriarch-bridge deadletter: unknown subcommand %q\n%s\n", args[0], deadLetterUsage)
	return cli.ExitUsage
}

// dlSource is where the dead letters are: -c FILE (its dead_letter.path)
// or --file.
type dlSource struct {
	config, file *string
	maxRecord    *int
}

func (s *dlSource) define(fs *flag.FlagSet) {
	s.config = fs.String("c", "", "configuration file (YAML): its bridge.dead_letter.path")
	s.file = fs.String("file", "", "the dead-letter file itself (instead of -c)")
	s.maxRecord = fs.Int("max-record-bytes", deadletter.DefaultMaxLine, "longest line read; a longer one is reported and skipped")
}

// path resolves the dead-letter file; cfg is the loaded configuration
// (nil with --file).
func (s *dlSource) path(needConfig bool) (string, *config.Config, error) {
	switch {
	case *s.config != "" && *s.file != "":
		return "", nil, errors.New("-c and --file: give one")
	case *s.file != "" && !needConfig:
		return *s.file, nil, nil
	case *s.config == "":
		if needConfig {
			return "", nil, errors.New("-c FILE is required: the senders and routes come from the configuration")
		}
		return "", nil, errors.New("-c FILE or --file DEADLETTERS is required")
	}
	data, err := os.ReadFile(*s.config)
	if err != nil {
		return "", nil, err
	}
	cfg, problems := config.Check(*s.config, data)
	if len(problems) > 0 && (needConfig || cfg == nil || cfg.Bridge.DeadLetterPath == "") {
		return "", nil, fmt.Errorf("%s: configuration refused:\n%w", *s.config, problems)
	}
	path := cfg.Bridge.DeadLetterPath
	if *s.file != "" {
		path = *s.file
	}
	return path, cfg, nil
}

// dlFilter selects records.
type dlFilter struct {
	route, sender, topic, reason *string
	since, until                 *string
	ids                          multiFlag
	sinceT, untilT               time.Time
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func (f *dlFilter) define(fs *flag.FlagSet, routeFlag string, withSender bool) {
	f.route = fs.String(routeFlag, "", "only records of this route")
	if withSender {
		f.sender = fs.String("sender", "", "only records of this sender")
	} else {
		f.sender = new(string)
	}
	f.topic = fs.String("topic", "", "only records whose topic or source topic matches this MQTT filter (+ and # wildcards)")
	f.reason = fs.String("reason", "", "only records whose reason contains this text (any case)")
	f.since = fs.String("since", "", "only records written at or after T (RFC 3339, or a duration before now such as 2h)")
	f.until = fs.String("until", "", "only records written before T (RFC 3339, or a duration before now)")
	fs.Var(&f.ids, "id", "only the record with this id (repeatable)")
}

// parse checks the filter's values; errors name flag, value and rule.
func (f *dlFilter) parse(now time.Time) error {
	var err error
	if f.sinceT, err = parseWhen("since", *f.since, now); err != nil {
		return err
	}
	if f.untilT, err = parseWhen("until", *f.until, now); err != nil {
		return err
	}
	if !f.sinceT.IsZero() && !f.untilT.IsZero() && !f.untilT.After(f.sinceT) {
		return fmt.Errorf("--until %q: must be after --since %q", *f.until, *f.since)
	}
	if *f.topic != "" {
		if err := validFilter(*f.topic); err != nil {
			return fmt.Errorf("--topic %q: %v", *f.topic, err)
		}
	}
	for _, id := range f.ids {
		if !deadletter.ValidID(id) {
			return fmt.Errorf("--id %q: must be %d hexadecimal digits (lower case), as list shows", id, deadletter.IDLen)
		}
	}
	return nil
}

// validFilter is the MQTT rule for a topic filter's wildcards.
func validFilter(f string) error {
	levels := strings.Split(f, "/")
	for i, l := range levels {
		switch {
		case l == "#" && i != len(levels)-1:
			return errors.New("# must be the last level")
		case l != "#" && l != "+" && strings.ContainsAny(l, "#+"):
			return errors.New("+ and # must fill a whole level")
		}
	}
	return nil
}

func parseWhen(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := godur.Parse(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("--%s %q: must be an RFC 3339 time (2026-01-02T15:04:05Z) or a non-negative duration before now (90m)", name, s)
	}
	return now.Add(-d), nil
}

func (f *dlFilter) match(e *deadletter.Entry) bool {
	switch {
	case *f.route != "" && e.Route != *f.route,
		*f.sender != "" && e.Sender != *f.sender,
		*f.topic != "" && !transport.Match(*f.topic, e.Topic) && !transport.Match(*f.topic, e.SourceTopic),
		*f.reason != "" && !strings.Contains(strings.ToLower(e.Reason), strings.ToLower(*f.reason)),
		!f.sinceT.IsZero() && e.Time.Before(f.sinceT),
		!f.untilT.IsZero() && !e.Time.Before(f.untilT):
		return false
	}
	if len(f.ids) > 0 {
		for _, id := range f.ids {
			if id == e.ID {
				return true
			}
		}
		return false
	}
	return true
}

// readDeadLetters streams path and keeps the records keep selects (so a
// large file is not held in memory), reporting unreadable lines on
// stderr; total counts every record read. A missing file is no dead
// letters.
func readDeadLetters(path string, maxRecord int, stderr io.Writer, keep func(*deadletter.Entry) bool) (sel []deadletter.Entry, total int, ok bool) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(stderr, "%s: no dead-letter file (nothing was dead-lettered)\n", clean(path))
		return nil, 0, true
	}
	if err != nil {
		fmt.Fprintln(stderr, "myriarch-bridge deadletter:", clean(err.Error()))
		return nil, 0, false
	}
	defer f.Close()
	problems, err := deadletter.Scan(f, maxRecord, func(e deadletter.Entry) error {
		total++
		if keep(&e) {
			sel = append(sel, e)
		}
		return nil
	})
	for _, p := range problems {
		fmt.Fprintf(stderr, "%s: %s\n", clean(path), clean(p.Error()))
	}
	if err != nil {
		fmt.Fprintln(stderr, "myriarch-bridge deadletter:", clean(err.Error()))
		return nil, total, false
	}
	return sel, total, true
}

// parseSub parses a subcommand's flags (interspersed with positional
// arguments, which it returns); false with the exit status on a bad flag.
func parseSub(fs *flag.FlagSet, args []string, stderr io.Writer) ([]string, int, bool) {
	pos, err := cli.ParseInterspersed(fs, args)
	if err != nil {
		return nil, cli.ParseStatus(err, true), false
	}
	return pos, 0, true
}

func usageErr(stderr io.Writer, sub string, err error) int {
	fmt.Fprintf(stderr, "myriarch-bridge deadletter %s: %s\n", sub, clean(err.Error()))
	return cli.ExitUsage
}

// listLine is one record of `list -o json`: the record and where it is.
type listLine struct {
	deadletter.Record
	Line   int   `json:"line"`
	Offset int64 `json:"offset"`
}

func dlList(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("myriarch-bridge deadletter list", "", stderr)
	var src dlSource
	src.define(fs)
	var f dlFilter
	f.define(fs, "route", true)
	out := fs.String("o", "table", "table, or json (one JSON object per line: the record with line and offset)")
	pos, code, ok := parseSub(fs, args, stderr)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return usageErr(stderr, "list", fmt.Errorf("unexpected argument %q", pos[0]))
	}
	if *out != "table" && *out != "json" {
		return usageErr(stderr, "list", fmt.Errorf("-o %q: must be table or json", *out))
	}
	if err := f.parse(time.Now()); err != nil {
		return usageErr(stderr, "list", err)
	}
	path, _, err := src.path(false)
	if err != nil {
		return usageErr(stderr, "list", err)
	}
	sel, total, ok := readDeadLetters(path, *src.maxRecord, stderr, f.match)
	if !ok {
		return exitDLFailed
	}
	if *out == "json" {
		enc := json.NewEncoder(stdout)
		for _, e := range sel {
			_ = enc.Encode(listLine{Record: e.Record, Line: e.Line, Offset: e.Offset})
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tLINE\tTIME\tROUTE\tSENDER\tTOPIC\tQOS\tBYTES\tATTEMPTS\tREASON")
	for _, e := range sel {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", e.ID, e.Line, e.Time.UTC().Format(time.RFC3339),
			cell(e.Route, 24), cell(e.Sender, 24), cell(e.Topic, 48), e.QoS, len(e.Payload), e.Attempts, cell(e.Reason, 72))
	}
	_ = tw.Flush()
	fmt.Fprintf(stdout, "%d of %d record(s)\n", len(sel), total)
	return 0
}

func dlInspect(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("myriarch-bridge deadletter inspect", "", stderr)
	var src dlSource
	src.define(fs)
	id := fs.String("id", "", "the record's id")
	line := fs.Int("line", 0, "the record on this line (from 1)")
	offset := fs.Int64("offset", -1, "the record whose line starts at this byte offset")
	payload := fs.String("payload", "auto", "auto (text if printable UTF-8, else hex), text (control characters escaped), hex, or raw (the bytes as they are: for piping, not for a terminal)")
	out := fs.String("o", "text", "text, or json (the record with line and offset)")
	pos, code, ok := parseSub(fs, args, stderr)
	if !ok {
		return code
	}
	if len(pos) > 1 {
		return usageErr(stderr, "inspect", fmt.Errorf("unexpected argument %q", pos[1]))
	}
	if len(pos) == 1 {
		if *id != "" {
			return usageErr(stderr, "inspect", errors.New("give the id once (argument or --id)"))
		}
		*id = pos[0]
	}
	given := 0
	for _, g := range []bool{*id != "", *line != 0, *offset >= 0} {
		if g {
			given++
		}
	}
	switch {
	case given != 1:
		return usageErr(stderr, "inspect", errors.New("name one record: ID, --id, --line or --offset"))
	case *id != "" && !deadletter.ValidID(*id):
		return usageErr(stderr, "inspect", fmt.Errorf("id %q: must be %d hexadecimal digits (lower case), as list shows", *id, deadletter.IDLen))
	case *line < 0:
		return usageErr(stderr, "inspect", fmt.Errorf("--line %d: must be at least 1", *line))
	case *payload != "auto" && *payload != "text" && *payload != "hex" && *payload != "raw":
		return usageErr(stderr, "inspect", fmt.Errorf("--payload %q: must be auto, text, hex or raw", *payload))
	case *out != "text" && *out != "json":
		return usageErr(stderr, "inspect", fmt.Errorf("-o %q: must be text or json", *out))
	}
	path, _, err := src.path(false)
	if err != nil {
		return usageErr(stderr, "inspect", err)
	}
	found, _, ok := readDeadLetters(path, *src.maxRecord, stderr, func(e *deadletter.Entry) bool {
		return (*id != "" && e.ID == *id) || (*line != 0 && e.Line == *line) || (*offset >= 0 && e.Offset == *offset)
	})
	if !ok {
		return exitDLFailed
	}
	if len(found) > 0 {
		e := found[0] // the first match: lines and offsets are unique, written ids too
		if *out == "json" {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(listLine{Record: e.Record, Line: e.Line, Offset: e.Offset})
		} else {
			writeInspect(stdout, e, *payload)
		}
		return 0
	}
	fmt.Fprintf(stderr, "myriarch-bridge deadletter inspect: %s: no record with %s\n", clean(path), which(*id, *line, *offset))
	return exitDLFailed
}

func which(id string, line int, offset int64) string {
	switch {
	case id != "":
		return "id " + id
	case line != 0:
		return fmt.Sprintf("line %d (a corrupt line is reported above)", line)
	}
	return fmt.Sprintf("a line starting at offset %d", offset)
}

func writeInspect(w io.Writer, e deadletter.Entry, payload string) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("id", e.ID)
	row("line", fmt.Sprintf("%d (offset %d)", e.Line, e.Offset))
	row("time", e.Time.UTC().Format(time.RFC3339Nano))
	row("route", clean(e.Route))
	row("sender", clean(e.Sender))
	row("topic", clean(e.Topic))
	row("source topic", clean(e.SourceTopic))
	row("qos", fmt.Sprint(e.QoS))
	row("retain", fmt.Sprint(e.Retain))
	if e.Received.IsZero() {
		row("received", "not recorded")
	} else {
		row("received", e.Received.UTC().Format(time.RFC3339Nano))
	}
	if st := e.Stamp(); st.IsZero() {
		row("fencing stamp", "none (non-exclusive session)")
	} else {
		row("fencing stamp", fmt.Sprintf("lease version %d, session %s", st.LeaseVersion, clean(st.SessionID)))
	}
	row("attempts", fmt.Sprint(e.Attempts))
	row("reason", clean(e.Reason))
	if p := e.Properties; p != nil {
		if p.ContentType != "" {
			row("content type", clean(p.ContentType))
		}
		if p.PayloadFormat != nil {
			row("payload format", fmt.Sprint(*p.PayloadFormat))
		}
		if p.MessageExpiry != nil {
			row("message expiry", fmt.Sprintf("%ds", *p.MessageExpiry))
		}
		if p.ResponseTopic != "" {
			row("response topic", clean(p.ResponseTopic))
		}
		if p.CorrelationData != nil {
			row("correlation data", hex.EncodeToString(p.CorrelationData))
		}
		for _, u := range p.User {
			row("user property", clean(u.Key)+" = "+clean(u.Value))
		}
	} else {
		row("properties", "none")
	}
	_ = tw.Flush()
	if payload == "auto" {
		payload = "hex"
		if utf8.Valid(e.Payload) && clean(string(e.Payload)) == string(e.Payload) {
			payload = "text"
		}
	}
	fmt.Fprintf(w, "payload (%d bytes, %s):\n", len(e.Payload), payload)
	switch payload {
	case "text":
		fmt.Fprintln(w, cleanText(string(e.Payload)))
	case "hex":
		fmt.Fprint(w, hex.Dump(e.Payload))
	case "raw":
		_, _ = w.Write(e.Payload)
	}
}

func dlReplay(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("myriarch-bridge deadletter replay", "", stderr)
	var src dlSource
	src.define(fs)
	var f dlFilter
	f.define(fs, "from-route", false)
	viaRoute := fs.String("route", "", "replay through this route: its current topic rewrite, its sender that gave up on each record (selects the route's records unless --from-route)")
	viaSender := fs.String("sender", "", "replay through this sender, with the recorded topics")
	dryRun := fs.Bool("dry-run", false, "send nothing: print what would be sent, one JSON object per record")
	rate := fs.Float64("rate", 100, "most messages sent per second (0: no limit)")
	again := fs.Bool("again", false, "also send records that the replay journal says were replayed")
	force := fs.Bool("force", false, "send through senders of an exclusive session's routes (replayed messages carry no fencing stamp)")
	keepRetain := fs.Bool("keep-retain", false, "keep the recorded retain flag (default: cleared, so a replay does not replace what the topic retained since)")
	timeout := fs.Duration("timeout", 30*time.Second, "longest wait for one message's verdict; past it the replay stops")
	pos, code, ok := parseSub(fs, args, stderr)
	if !ok {
		return code
	}
	switch {
	case len(pos) > 0:
		return usageErr(stderr, "replay", fmt.Errorf("unexpected argument %q", pos[0]))
	case (*viaRoute == "") == (*viaSender == ""):
		return usageErr(stderr, "replay", errors.New("give one destination: --route ROUTE or --sender SENDER"))
	case *rate < 0 || *rate != *rate:
		return usageErr(stderr, "replay", fmt.Errorf("--rate %v: must be 0 (no limit) or a positive number of messages per second", *rate))
	case *timeout <= 0:
		return usageErr(stderr, "replay", fmt.Errorf("--timeout %v: must be positive", *timeout))
	}
	if err := f.parse(time.Now()); err != nil {
		return usageErr(stderr, "replay", err)
	}
	if *src.file != "" {
		return usageErr(stderr, "replay", errors.New("--file: replay reads the dead-letter file that -c names (its senders and journal belong to that configuration)"))
	}
	path, cfg, err := src.path(true)
	if err != nil {
		return usageErr(stderr, "replay", err)
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stderr, "warning:", clean(w))
	}
	dest := replay.Destination{Types: map[string]string{}}
	for _, s := range cfg.Senders {
		dest.Types[s.ID] = s.Type
	}
	var destSenders []string
	if *viaRoute != "" {
		var rt *config.RouteSettings
		for i := range cfg.Routes {
			if cfg.Routes[i].ID == *viaRoute {
				rt = &cfg.Routes[i]
			}
		}
		if rt == nil {
			return usageErr(stderr, "replay", fmt.Errorf("--route %q: no such route in %s (routes: %s)", *viaRoute, *src.config, routeIDs(cfg)))
		}
		r := routeOf(cfg, rt)
		dest.Route, dest.RouteSenders = rt.ID, rt.Senders
		dest.Rewrite = func(topic string) (string, bool) { return r.Rewrite(topic), r.Matches(topic) }
		destSenders = rt.Senders
		if *f.route == "" {
			*f.route = rt.ID
		}
	} else {
		if cfg.Sender(*viaSender) == nil {
			return usageErr(stderr, "replay", fmt.Errorf("--sender %q: no such sender in %s (senders: %s)", *viaSender, *src.config, senderIDs(cfg)))
		}
		dest.Sender = *viaSender
		destSenders = []string{*viaSender}
	}
	if fenced := exclusiveUses(cfg, destSenders); len(fenced) > 0 {
		msg := "sender(s) of exclusive sessions: " + strings.Join(fenced, "; ") +
			". A replayed message carries no fencing stamp (it is no act of the session's lease) and is sent beside the owner's live messages"
		if !*force && !*dryRun {
			fmt.Fprintf(stderr, "myriarch-bridge deadletter replay: refused: %s; rerun with --force to send anyway\n", clean(msg))
			return cli.ExitUsage
		}
		fmt.Fprintf(stderr, "note: %s\n", clean(msg))
	}

	sel, _, ok := readDeadLetters(path, *src.maxRecord, stderr, f.match)
	if !ok {
		return exitDLFailed
	}
	jpath := deadletter.JournalPath(path)
	var journal *deadletter.Journal
	var jproblems []deadletter.Problem
	if *dryRun {
		journal, jproblems, err = deadletter.ReadJournal(jpath)
	} else {
		journal, jproblems, err = deadletter.OpenJournal(jpath)
	}
	if err != nil {
		fmt.Fprintln(stderr, "myriarch-bridge deadletter replay:", clean(err.Error()))
		return exitDLFailed
	}
	defer journal.Close()
	for _, p := range jproblems {
		fmt.Fprintf(stderr, "%s: %s\n", clean(jpath), clean(p.Error()))
	}

	opts := replay.Options{Dest: dest, Journal: journal, DryRun: *dryRun, Again: *again, KeepRetain: *keepRetain,
		Rate: *rate, Timeout: *timeout, Run: deadletter.NewID(), Out: stdout}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !*dryRun && len(sel) > 0 {
		senders, err := openReplaySenders(cfg, destSenders, opts.Run, stderr)
		if err != nil {
			fmt.Fprintln(stderr, "myriarch-bridge deadletter replay:", redact(err.Error()))
			return exitDLFailed
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for id, s := range senders {
				if err := s.Close(cctx); err != nil {
					fmt.Fprintf(stderr, "closing sender %q: %s\n", id, redact(err.Error()))
				}
			}
		}()
		opts.Senders = senders
	}
	sum, err := replay.Run(ctx, sel, opts)
	if *dryRun {
		fmt.Fprintf(stderr, "dry run: %d record(s) selected, %d would be sent, %d skipped; nothing sent, nothing recorded\n", sum.Selected, sum.WouldSend, sum.Skipped)
	} else {
		fmt.Fprintf(stderr, "replay %s: %d record(s) selected: %d sent, %d failed, %d unknown, %d skipped; journal %s\n",
			opts.Run, sum.Selected, sum.Sent, sum.Failed, sum.Unknown, sum.Skipped, clean(jpath))
	}
	if err != nil {
		fmt.Fprintln(stderr, "myriarch-bridge deadletter replay:", redact(err.Error()))
		return exitDLFailed
	}
	if sum.Failed > 0 || sum.Unknown > 0 {
		return exitDLFailed
	}
	return 0
}

// routeOf builds the route's topic rewrite and match as the bridge does
// (the route sends nothing: it has no targets).
func routeOf(cfg *config.Config, rt *config.RouteSettings) *routing.Route {
	var filters []string
	if recv := cfg.Receiver(rt.Receiver); recv != nil {
		for _, t := range recv.Topics {
			filters = append(filters, t.Filter)
		}
	}
	var ms []routing.Mapping
	for _, m := range rt.Mappings {
		ms = append(ms, routing.Mapping{Pattern: m.Pattern, SourcePrefix: m.SourcePrefix, DestinationPrefix: m.DestinationPrefix})
	}
	return routing.NewRoute(routing.RouteConfig{ID: rt.ID, Filters: filters, StripPrefix: rt.StripPrefix, AddPrefix: rt.AddPrefix, Mappings: ms})
}

// exclusiveUses lists, for each of senders that a route of an exclusive
// session feeds, the sender, the route and the session.
func exclusiveUses(cfg *config.Config, senders []string) []string {
	var out []string
	for _, rt := range cfg.Routes {
		s := cfg.Session(rt.Session)
		if s == nil || s.Mode != config.Exclusive {
			continue
		}
		for _, id := range rt.Senders {
			for _, want := range senders {
				if id == want {
					out = append(out, fmt.Sprintf("sender %q (route %q, exclusive session %q)", id, rt.ID, rt.Session))
				}
			}
		}
	}
	return out
}

func openReplaySenders(cfg *config.Config, ids []string, run string, stderr io.Writer) (map[string]sender.Sender, error) {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	out := map[string]sender.Sender{}
	for _, id := range ids {
		s, err := runtime.OpenSender(*cfg.Sender(id), "replay-"+run[:8], log.With("sender", id))
		if err != nil {
			for _, o := range out {
				_ = o.Close(context.Background())
			}
			return nil, fmt.Errorf("sender %q: %w", id, err)
		}
		out[id] = s
	}
	return out, nil
}

func routeIDs(cfg *config.Config) string {
	var ids []string
	for _, r := range cfg.Routes {
		ids = append(ids, r.ID)
	}
	return strings.Join(ids, ", ")
}

func senderIDs(cfg *config.Config) string {
	var ids []string
	for _, s := range cfg.Senders {
		ids = append(ids, s.ID)
	}
	return strings.Join(ids, ", ")
}

// redact removes credentials from URLs in s (a sender's error may quote
// its URL) and escapes it for the terminal.
func redact(s string) string {
	return clean(replay.Redact(s))
}

// clean escapes what a terminal would act on: control characters
// (escape sequences, carriage returns, newlines), bidirectional
// overrides and invalid UTF-8, so that a payload, topic or reason cannot
// rewrite the screen or hide text.
func clean(s string) string {
	return escape(s, false)
}

// cleanText is clean that keeps newlines and tabs: a text payload shown
// as it is, on lines.
func cleanText(s string) string {
	return escape(s, true)
}

func escape(s string, keepLines bool) string {
	ok := true
	for _, r := range s {
		if !printable(r, keepLines) {
			ok = false
			break
		}
	}
	if ok && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case printable(r, keepLines):
			b.WriteString(s[i : i+n])
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

func printable(r rune, keepLines bool) bool {
	if keepLines && (r == '\n' || r == '\t') {
		return true
	}
	if r == '\\' {
		return true
	}
	// Bidi controls and other format characters (Cf) reorder or hide text.
	return unicode.IsPrint(r) && !unicode.Is(unicode.Cf, r) || r == ' '
}

// cell is clean, shortened to width runes for a table cell.
func cell(s string, width int) string {
	s = clean(s)
	if utf8.RuneCountInString(s) <= width {
		if s == "" {
			return "-"
		}
		return s
	}
	r := []rune(s)
	return string(r[:width-1]) + "…"
}
