package ui

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/gitops"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/godur"
)

// who names the logged-in token (created_by of a rollout).
func (h *handler) who(r *http.Request) string {
	return "ui (token " + api.TokenName(r.Context()) + ")"
}

func (h *handler) configs(w http.ResponseWriter, r *http.Request) {
	cs, err := store.ListConfigs(r.Context(), h.a.Store().Pool)
	if err != nil {
		h.fail(w, err)
		return
	}
	srcs, err := gitops.Statuses(r.Context(), h.a.Store().Pool)
	if err != nil {
		h.fail(w, err)
		return
	}
	h.render(w, r, "configs", "Configurations", struct {
		Configs []store.ConfigDef
		GitOps  []gitops.Status
	}{cs, srcs})
}

type configData struct {
	api.ConfigDetail
	Selector string
	Shown    store.Revision
	Diff     *api.DiffResult
	From, To int
	Error    string
	Defaults rollout.Spec
	// Orders are the wave orders the rollout form offers.
	Orders []string
	// Plan is the dry run of the rollout form (its Plan button).
	Plan *rollout.Plan
	// Preview is the revision PreviewRev against what the agents run now
	// (narrowed by PreviewSelector).
	Preview         *configs.Preview
	PreviewRev      int
	PreviewSelector string
}

func (h *handler) config(w http.ResponseWriter, r *http.Request) {
	h.renderConfig(w, r, r.PathValue("name"), "", nil)
}

// planRollout shows the dry run of the rollout form on the configuration
// page (rollout.Service.Plan: nothing is stored).
func (h *handler) planRollout(w http.ResponseWriter, r *http.Request) {
	name := r.PostFormValue("config")
	req, err := rolloutForm(r)
	if err == nil {
		var p rollout.Plan
		if p, err = h.a.Rollouts().Plan(r.Context(), req); err == nil {
			h.renderConfig(w, r, name, "", &p)
			return
		}
	}
	h.renderConfig(w, r, name, err.Error(), nil)
}

func (h *handler) renderConfig(w http.ResponseWriter, r *http.Request, name, formErr string, plan *rollout.Plan) {
	ctx := r.Context()
	cd, err := h.a.ConfigDetail(ctx, name)
	if h.failed(w, err, "configuration "+name) {
		return
	}
	d := configData{ConfigDetail: cd, Selector: configs.FormatSelector(cd.Config.Selector), Error: formErr,
		Defaults: rollout.Spec{}.WithDefaults(), Orders: rollout.Orders, Plan: plan}
	q := r.URL.Query()
	if v := q.Get("preview"); v != "" {
		d.PreviewRev, _ = strconv.Atoi(v)
		d.PreviewSelector = q.Get("selector")
		sel, err := store.ParseSelector(d.PreviewSelector)
		if err == nil {
			var p configs.Preview
			if p, err = h.a.Configs().Preview(ctx, name, d.PreviewRev, sel); err == nil {
				d.Preview = &p
			}
		}
		if err != nil {
			d.Error = fmt.Sprintf("preview of revision %q: %v", v, err)
		}
	}
	show := cd.Config.LatestRevision
	if n, err := strconv.Atoi(q.Get("revision")); err == nil {
		show = n
	}
	if show > 0 {
		if d.Shown, err = store.GetRevision(ctx, h.a.Store().Pool, name, show); err != nil && !errors.Is(err, store.ErrNotFound) {
			h.fail(w, err)
			return
		}
	}
	d.From, d.To = cd.Config.LatestRevision-1, cd.Config.LatestRevision
	if f, err := strconv.Atoi(q.Get("from")); err == nil {
		d.From = f
	}
	if t, err := strconv.Atoi(q.Get("to")); err == nil {
		d.To = t
	}
	if q.Has("from") || q.Has("to") {
		df, err := h.a.Diff(ctx, name, d.From, d.To)
		if err != nil {
			d.Error = err.Error()
		} else {
			d.Diff = &df
		}
	}
	if formErr != "" {
		w.WriteHeader(http.StatusBadRequest)
	}
	h.render(w, r, "config", "Configuration "+name, d)
}

type rolloutsData struct {
	Rollouts []rollout.Summary
	Refresh  bool
}

func (h *handler) rollouts(w http.ResponseWriter, r *http.Request) {
	rs, err := h.a.Rollouts().List(r.Context(), r.URL.Query().Get("config"), 100)
	if err != nil {
		h.fail(w, err)
		return
	}
	d := rolloutsData{Rollouts: rs}
	for _, x := range rs {
		if x.Active() {
			d.Refresh = true
		}
	}
	h.renderRefresh(w, r, "rollouts", "Rollouts", d, d.Refresh && r.URL.Query().Get("refresh") != "0")
}

func (h *handler) createRollout(w http.ResponseWriter, r *http.Request) {
	name := r.PostFormValue("config")
	req, err := rolloutForm(r)
	if err == nil {
		var ro rollout.Rollout
		ro, err = h.a.Rollouts().Create(r.Context(), req, h.who(r))
		if err == nil {
			http.Redirect(w, r, fmt.Sprintf("/ui/rollouts/%d", ro.ID), http.StatusSeeOther)
			return
		}
	}
	h.renderConfig(w, r, name, err.Error(), nil)
}

// rolloutForm reads the create form of the configuration page.
func rolloutForm(r *http.Request) (rollout.Request, error) {
	f := func(k string) string { return strings.TrimSpace(r.PostFormValue(k)) }
	req := rollout.Request{Config: f("config")}
	var errs []error
	atoi := func(k string, dst *int) {
		if v := f(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %q: must be an integer", k, v))
			}
			*dst = n
		}
	}
	dur := func(k string) *float64 {
		v := f(k)
		if v == "" {
			return nil
		}
		d, err := godur.Parse(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", k, v, err))
			return nil
		}
		return rollout.Secs(d.Seconds())
	}
	atoi("to_revision", &req.ToRevision)
	atoi("max_in_progress", &req.Spec.MaxInProgress)
	atoi("max_failed", &req.Spec.MaxFailed)
	req.Spec.BakeS = dur("bake")
	if at := dur("apply_timeout"); at != nil {
		req.Spec.ApplyTimeoutS = *at
	}
	if v := f("waves"); v != "" {
		for w := range strings.SplitSeq(v, ",") {
			req.Spec.Waves = append(req.Spec.Waves, strings.TrimSpace(w))
		}
	}
	req.Spec.FailurePolicy = f("failure_policy")
	req.Spec.Order = f("order")
	return req, errors.Join(errs...)
}

type rolloutData struct {
	rollout.Detail
	CanPause, CanResume, CanRollback, CanAbort bool
	// Live: the page reloads itself (an active rollout, unless ?refresh=0).
	Live bool
	// Throughput of its agents around its waves (telemetry.go); nil: none.
	Throughput *rolloutPicture
}

func (h *handler) rollout(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.Error(w, "no rollout "+r.PathValue("id"), http.StatusNotFound)
		return
	}
	d, err := h.a.Rollouts().Detail(r.Context(), id, 1000)
	if h.failed(w, err, "rollout "+r.PathValue("id")) {
		return
	}
	rd := rolloutData{Detail: d, CanPause: d.State == rollout.StateRunning || d.State == rollout.StatePending,
		CanResume: d.State == rollout.StatePaused, CanRollback: (d.State == rollout.StateRunning || d.State == rollout.StatePaused) && d.FromRevision > 0,
		CanAbort: d.Active()}
	rd.Live = d.Active() && r.URL.Query().Get("refresh") != "0"
	rd.Throughput = h.rolloutPicture(r.Context(), d)
	h.renderRefresh(w, r, "rollout", fmt.Sprintf("Rollout %d", id), rd, rd.Live)
}

func (h *handler) rolloutCommand(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.Error(w, "no rollout "+r.PathValue("id"), http.StatusNotFound)
		return
	}
	if _, err := h.a.Rollouts().Command(r.Context(), id, r.PathValue("command")); err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	h.log.Info("rollout command from the UI", "rollout", id, "command", r.PathValue("command"), "by", h.who(r))
	http.Redirect(w, r, fmt.Sprintf("/ui/rollouts/%d", id), http.StatusSeeOther)
}
