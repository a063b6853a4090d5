package server

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// Remote commands (docs/operations.md#remote-commands).

// commandBody is the body of POST /api/v1/commands: the command and
// exactly one target.
type commandBody struct {
	Kind      string       `json:"kind" openapi:"required"`
	Args      []string     `json:"args"`
	Timeout   int          `json:"timeout"`    // seconds
	ExpiresIn int          `json:"expires_in"` // seconds
	DeviceID  uint64       `json:"device_id,string"`
	Label     string       `json:"label"`
	Filter    *labelFilter `json:"filter"`
}

func (a *api) sendCommand(r *http.Request) (any, error) {
	var in commandBody
	if err := decodeStrict(r, "", &in); err != nil {
		return nil, err
	}
	targets := 0
	var t fleet.Target
	if in.DeviceID != 0 {
		targets++
		t.DeviceID = in.DeviceID
	}
	if in.Label != "" {
		targets++
		t.Filter = (&labelFilter{Labels: []string{in.Label}}).values()
	}
	if in.Filter != nil {
		targets++
		t.Filter = in.Filter.values()
	}
	if targets != 1 {
		return nil, badField(`name exactly one target: device_id, label or filter ({} selects every device)`)
	}
	if in.ExpiresIn < 0 {
		return nil, badField("expires_in must be a positive number of seconds")
	}
	spec := fleet.CommandSpec{Kind: in.Kind, Args: in.Args, Timeout: in.Timeout, TTL: time.Duration(in.ExpiresIn) * time.Second}
	j, err := a.fleet.SendCommand(r.Context(), spec, t)
	if err != nil {
		return nil, ifNotFound(err, "device "+strconv.FormatUint(in.DeviceID, 10))
	}
	return created(j), nil
}

func (a *api) listCommands(r *http.Request) (any, error) {
	limit, err := optUint(r.URL.Query().Get("limit"))
	if err != nil || limit > 1000 {
		return nil, badField("limit must be 0..1000")
	}
	return jobList{a.fleet.Jobs(int(limit))}, nil
}

func (a *api) getCommand(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	j, err := a.fleet.Job(id)
	return j, ifNotFound(err, "command "+strconv.FormatUint(id, 10))
}

// commandQuery reads state, after and limit.
func commandQuery(r *http.Request) (fleet.CommandQuery, error) {
	v := r.URL.Query()
	var q fleet.CommandQuery
	if s := v.Get("state"); s != "" {
		st, ok := fleet.ParseCommandState(s)
		if !ok {
			return q, badField("state must be queued, delivered, succeeded, failed, expired or cancelled")
		}
		q.State = &st
	}
	c, err := cursor(r, "after")
	if err != nil {
		return q, err
	}
	after, err := optUint(c)
	if err != nil {
		return q, badField("cursor must be a next_cursor value")
	}
	limit, err := optUint(v.Get("limit"))
	if err != nil || limit > 1000 {
		return q, badField("limit must be 0..1000")
	}
	q.After, q.Limit = after, int(limit)
	return q, nil
}

func (a *api) commandDevices(r *http.Request) (any, error) {
	return a.pagedCommands(r, "command ", func(q *fleet.CommandQuery, id uint64) { q.JobID = id },
		func(c fleet.DeviceCommand) uint64 { return c.DeviceID })
}

func (a *api) deviceCommands(r *http.Request) (any, error) {
	return a.pagedCommands(r, "device ", func(q *fleet.CommandQuery, id uint64) { q.DeviceID = id },
		func(c fleet.DeviceCommand) uint64 { return c.JobID })
}

// pagedCommands answers a page of a job's (or a device's) commands: set
// puts the path's {id} into the query, next is a row's after value.
func (a *api) pagedCommands(r *http.Request, what string, set func(*fleet.CommandQuery, uint64), next func(fleet.DeviceCommand) uint64) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	q, err := commandQuery(r)
	if err != nil {
		return nil, err
	}
	set(&q, id)
	if q.Limit == 0 {
		q.Limit = 100
	}
	cmds, err := a.fleet.JobCommands(r.Context(), q)
	if err != nil {
		return nil, ifNotFound(err, what+strconv.FormatUint(id, 10))
	}
	out := commandPage{Commands: cmds}
	if n := len(cmds); n > 0 && n == q.Limit {
		c := strconv.FormatUint(next(cmds[n-1]), 10)
		out.NextCursor, out.NextAfter = c, c
	}
	return out, nil
}

// changeCommand pauses, resumes or cancels a job.
func (a *api) changeCommand(op string) apiFunc {
	return func(r *http.Request) (any, error) {
		id, err := pathID(r)
		if err != nil {
			return nil, err
		}
		var j fleet.Job
		switch op {
		case "pause", "resume":
			j, err = a.fleet.PauseJob(r.Context(), id, op == "pause")
		case "cancel":
			j, err = a.fleet.CancelJob(r.Context(), id)
		}
		if errors.Is(err, fleet.ErrJobState) {
			return nil, &apiError{status: http.StatusConflict, code: "conflict", msg: "cannot " + op + " a command that is " + a.jobState(id)}
		}
		return j, ifNotFound(err, "command "+strconv.FormatUint(id, 10))
	}
}

func (a *api) jobState(id uint64) string {
	j, _ := a.fleet.Job(id)
	return j.State
}

// commandLoop expires overdue commands and closes finished jobs until ctx
// ends; in cluster mode on the leader only.
func (s *Server) commandLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.node != nil && !s.node.Leader() {
			continue // cluster mode: the leader alone sweeps (docs/commands.md)
		}
		if err := s.fleet.SweepCommands(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("command sweep failed", "err", err)
		}
	}
}
