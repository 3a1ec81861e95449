package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/budget"
	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/cli"
)

func init() {
	commands.Register(cli.Command{
		Name:    "check",
		Summary: "validate a configuration file and disclose the failover budget of each exclusive session",
		Run:     runCheck,
	})
}

// checkReport is the JSON object of `myriarch-bridge check --json`.
type checkReport struct {
	Config   string                `json:"config"`
	Admitted bool                  `json:"admitted"`
	Errors   []string              `json:"errors"`
	Warnings []string              `json:"warnings"`
	Sessions []budget.BridgeReport `json:"sessions"`
}

func runCheck(args []string, stdout, stderr io.Writer) int {
	fs, file := fileFlags("myriarch-bridge check", stderr)
	asJSON := fs.Bool("json", false, "print one JSON object: errors, warnings and, per exclusive session, the fields of `budget --json` plus session_id")
	if code, ok := parseFileFlags(fs, file, args, "usage: myriarch-bridge check -c FILE [--json]", stderr); !ok {
		return code
	}
	r := check(*file)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
	} else {
		for i, s := range r.Sessions {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			fmt.Fprintf(stdout, "Exclusive session %q\n", s.SessionID)
			budget.WriteBridgeTable(stdout, s)
		}
		for _, w := range r.Warnings {
			fmt.Fprintln(stdout, "warning:", w)
		}
		if r.Admitted {
			fmt.Fprintf(stdout, "%s: configuration valid; every exclusive session admitted\n", r.Config)
		} else {
			fmt.Fprintf(stdout, "%s: configuration refused: %d problem(s), listed on standard error\n", r.Config, len(r.Errors))
		}
	}
	for _, e := range r.Errors {
		fmt.Fprintln(stderr, e)
	}
	if !r.Admitted {
		return cli.ExitUsage
	}
	return 0
}

func check(file string) checkReport {
	r := checkReport{Config: file, Errors: []string{}, Warnings: []string{}, Sessions: []budget.BridgeReport{}}
	data, err := os.ReadFile(file)
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
		return r
	}
	cfg, problems := config.Check(file, data)
	for _, p := range problems {
		r.Errors = append(r.Errors, p.Error())
	}
	r.Admitted = len(problems) == 0
	if cfg == nil {
		return r
	}
	r.Warnings = append(r.Warnings, cfg.Warnings...)
	r.Sessions = sessionReports(cfg, problems)
	return r
}

// sessionProblems are the problems of the configuration that concern
// session id: on the session itself (sessions[i]), on a route that uses it
// (routes[j]), or naming it (a divergence between its routes).
func sessionProblems(cfg *config.Config, problems config.Problems, id string) []string {
	var out []string
	for _, p := range problems {
		mine := strings.Contains(p.Rule, fmt.Sprintf("session %q", id))
		for i, s := range cfg.Sessions {
			mine = mine || (s.ID == id && within(p.Path, fmt.Sprintf("sessions[%d]", i)))
		}
		for j, rt := range cfg.Routes {
			mine = mine || (rt.Session == id && within(p.Path, fmt.Sprintf("routes[%d]", j)))
		}
		if mine {
			out = append(out, p.Error())
		}
	}
	return out
}

// within reports whether path is prefix or below it.
func within(path, prefix string) bool {
	rest, ok := strings.CutPrefix(path, prefix)
	return ok && (rest == "" || rest[0] == '.' || rest[0] == '[')
}

// sessionReports discloses every exclusive session that a route uses: its
// canonical assessment, or, when its routes could not be canonicalized,
// the assessment of its first route. A session's verdict agrees with the
// exit status: in a refused configuration no session is admitted (a
// refused file runs nothing), and each report lists the problems that
// concern its session.
func sessionReports(cfg *config.Config, problems config.Problems) []budget.BridgeReport {
	var out []budget.BridgeReport
	for _, s := range cfg.Sessions {
		if s.Mode != config.Exclusive {
			continue
		}
		var a *failover.Assessment
		if c := cfg.ExclusiveSession(s.ID); c != nil {
			a = &c.Assessment
		} else if first := cfg.Admission.FirstInput(s.ID); first != nil {
			a = &first.Assessment
		}
		if a == nil {
			continue
		}
		rep := budget.NewBridgeReport(cfg.Bridge.DeploymentMode, *a)
		rep.SessionID = s.ID
		if q, ok := cfg.QueueRoom[s.ID]; ok {
			// A refusal is already among the config's problems.
			rep.WithQueueRoom(q)
		}
		if len(problems) > 0 {
			// The configuration's problems hold the assessment's own
			// refusals too, with their file, line and key.
			rep.Admitted = false
			rep.Errors = sessionProblems(cfg, problems, s.ID)
			if len(rep.Errors) == 0 {
				rep.Errors = append(rep.Errors, fmt.Sprintf("the configuration is refused (%d problem(s) elsewhere in it), so no session runs", len(problems)))
			}
		}
		out = append(out, rep)
	}
	if out == nil {
		out = []budget.BridgeReport{}
	}
	return out
}
