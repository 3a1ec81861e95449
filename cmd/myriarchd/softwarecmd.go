package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/apiclient"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
)

func init() {
	name := []string{"NAME"}
	apiCommands = append(apiCommands,
		apiCmd{group: "package", name: "list", summary: "package sources (GET /api/v1/packages)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				l, err := c.Packages(ctx)
				return l, func(w io.Writer) { printPackages(w, l.Packages) }, err
			}},
		apiCmd{group: "package", name: "put", args: name, summary: "create or update a package source (PUT /api/v1/packages/{name})",
			flags: map[string]string{"type": "oci or github", "source": "oci: the repository (registry/path); github: owner/repo",
				"constraint":    "semver constraint of the versions to track (\">= 1.2, < 2\"); empty: any",
				"poll-interval": "how often the source is polled (default 5m)", "public-key-file": "file with the base64 ed25519 key that signs every asset"},
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				req := api.PackageRequest{Type: x.str("type"), Source: x.str("source"), Constraint: x.str("constraint"), PollInterval: x.str("poll-interval")}
				if req.PollInterval == "" {
					req.PollInterval = "5m"
				}
				if f := x.str("public-key-file"); f != "" {
					b, err := os.ReadFile(f)
					if err != nil {
						x.bad = append(x.bad, "--public-key-file: "+err.Error())
					}
					req.PublicKey = strings.TrimSpace(string(b))
				}
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				s, err := c.PutPackage(ctx, x.arg(0), req)
				return s, func(w io.Writer) { fmt.Fprintf(w, "stored package source %s (%s %s)\n", s.Name, s.Type, s.Source) }, err
			}},
		apiCmd{group: "package", name: "delete", args: name, summary: "delete a package source (DELETE /api/v1/packages/{name})",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				err := c.DeletePackage(ctx, x.arg(0))
				return map[string]string{"deleted": x.arg(0)}, func(w io.Writer) { fmt.Fprintf(w, "deleted package source %s\n", x.arg(0)) }, err
			}},
		apiCmd{group: "package", name: "versions", summary: "the package versions the fleet runs (GET /api/v1/packages/versions)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				l, err := c.Versions(ctx)
				return l, nil, err
			}},
		apiCmd{group: "package", name: "artifacts", summary: "stored artifacts and download progress (GET /api/v1/artifacts)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				l, err := c.Artifacts(ctx)
				return l, nil, err
			}},
		apiCmd{group: "package", name: "offer", args: []string{"NAME", "VERSION"}, summary: "offer a recorded version to agents directly (POST /api/v1/packages/{name}/offers)",
			flags: map[string]string{"agents": "instance UIDs, comma-separated"},
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				var uids []string
				if v := x.str("agents"); v != "" {
					uids = strings.Split(v, ",")
				}
				l, err := c.Offer(ctx, x.arg(0), api.OfferRequest{Version: x.arg(1), Agents: uids})
				return l, func(w io.Writer) { fmt.Fprintf(w, "offered %s %s to %d agent(s)\n", x.arg(0), x.arg(1), len(l.Offers)) }, err
			}},
		apiCmd{group: "package", name: "rollout", args: []string{"NAME", "VERSION"}, summary: "roll VERSION of package NAME out in waves (POST /api/v1/packages/{name}/rollouts)",
			flags: withSpecFlags(map[string]string{}),
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				req := api.PackageRolloutRequest{Version: x.arg(1), Spec: x.spec()}
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				ro, err := c.CreatePackageRollout(ctx, x.arg(0), req)
				return ro, func(w io.Writer) {
					fmt.Fprintf(w, "package rollout %d created: %s %s\n", ro.ID, ro.Package, ro.Version)
				}, err
			}},
		apiCmd{group: "package", name: "rollouts", summary: "package-version rollouts (GET /api/v1/package-rollouts)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				l, err := c.PackageRollouts(ctx)
				return l, func(w io.Writer) { printPackageRollouts(w, l.Rollouts) }, err
			}},
	)
	for _, cmd := range []string{"pause", "resume", "abort"} {
		apiCommands = append(apiCommands, apiCmd{group: "package", name: "rollout-" + cmd, args: []string{"ID"},
			summary: cmd + " a package rollout (POST /api/v1/package-rollouts/{id}/" + cmd + ")",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				id := x.id(0, "package rollouts")
				if err := x.refused(); err != nil {
					return nil, nil, err
				}
				err := c.PackageRolloutCommand(ctx, id, cmd)
				return map[string]any{"id": id, "command": cmd}, func(w io.Writer) { fmt.Fprintf(w, "package rollout %d: %s requested\n", id, cmd) }, err
			}})
	}
	registerGroup("package", "agent software: package list | put | delete | versions | artifacts | offer | rollout | rollouts | rollout-pause|rollout-resume|rollout-abort", "", nil)

	apiCommands = append(apiCommands,
		apiCmd{group: "release", name: "list", args: []string{"[PACKAGE]"}, summary: "recorded releases, of PACKAGE only if given (GET /api/v1/releases, /api/v1/packages/{name}/releases)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				l, err := c.Releases(ctx, x.arg(0))
				return l, func(w io.Writer) { printReleases(w, l.Releases) }, err
			}},
		apiCmd{group: "gitops", name: "status", summary: "the Git sources of configurations and their last sync (GET /api/v1/gitops)",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				l, err := c.GitOps(ctx)
				return l, func(w io.Writer) {
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "SOURCE\tCOMMIT\tLAST POLL\tLAST CHANGE\tLAST ERROR")
					for _, s := range l.Sources {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Source, short(s.LastCommit), ts(s.LastPollAt), ts(s.LastChangeAt), s.LastError)
					}
					_ = tw.Flush()
				}, err
			}},
	)
	registerGroup("release", "recorded releases of agent software: release list [PACKAGE]", "", nil)
	registerGroup("gitops", "configurations from Git: gitops status", "", nil)
}

func printPackages(w io.Writer, ps []releases.Source) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tSOURCE\tCONSTRAINT\tPOLL\tLAST POLLED\tLAST ERROR")
	for _, s := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%gs\t%s\t%s\n", s.Name, s.Type, s.Source, s.Constraint, s.PollIntervalS, ts(s.LastPolledAt), s.LastError)
	}
	_ = tw.Flush()
}

func printReleases(w io.Writer, rs []releases.Release) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PACKAGE\tVERSION\tPUBLISHED\tRECORDED\tASSETS")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", r.Package, r.Version, ts(&r.PublishedAt), ts(&r.RecordedAt), len(r.Assets))
	}
	_ = tw.Flush()
}

func printPackageRollouts(w io.Writer, rs []upgrades.Rollout) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPACKAGE\tVERSION\tSTATE\tWAVE")
	for _, r := range rs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d/%d\n", r.ID, r.Package, r.Version, r.State, r.Wave, r.Waves)
	}
	_ = tw.Flush()
}
