package gitops

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// RunOptions are what `drover ctl apply` was asked.
type RunOptions struct {
	Paths  []string // files and directories of the description
	DryRun bool     // show the plan, change nothing
	Prune  bool     // delete what the description does not name (Options.Prune)
	JSON   bool     // write the plan and its result as JSON
	Stdout io.Writer
}

// planJSON is a plan as --json writes it.
type planJSON struct {
	DryRun    bool         `json:"dry_run"`
	Created   int          `json:"created"`
	Changed   int          `json:"changed"`
	Deleted   int          `json:"deleted"`
	Unchanged int          `json:"unchanged"`
	Changes   []changeJSON `json:"changes"`
}

type changeJSON struct {
	Kind   string `json:"kind"`
	Key    string `json:"key,omitempty"`
	Action string `json:"action"`
	File   string `json:"file"`
	Line   int    `json:"line"`
	Diff   string `json:"diff,omitempty"`
}

// Run reads the description, plans it against the server and, unless
// DryRun, applies it. An invalid description is an *InvalidError and
// changes nothing.
func Run(ctx context.Context, api API, o RunOptions) error {
	objs, err := ReadPaths(o.Paths)
	if err != nil {
		return err
	}
	plan, err := Prepare(ctx, api, objs, Options{Prune: o.Prune})
	if err != nil {
		return err
	}
	created, changed, deleted, unchanged := plan.Counts()
	if o.JSON {
		out := planJSON{DryRun: o.DryRun, Created: created, Changed: changed, Deleted: deleted, Unchanged: unchanged, Changes: []changeJSON{}}
		for _, c := range plan.Changes {
			cj := changeJSON{Kind: c.Object.Kind, Key: c.Object.Key(), Action: c.Action, File: c.Object.Pos.File, Line: c.Object.Pos.Line}
			if c.Action != Unchanged {
				cj.Diff = c.diff()
			}
			out.Changes = append(out.Changes, cj)
		}
		if !o.DryRun {
			if err := plan.Apply(ctx, api, nil); err != nil {
				return err
			}
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		_, err := fmt.Fprintf(o.Stdout, "%s\n", b)
		return err
	}
	if err := plan.Write(o.Stdout); err != nil {
		return err
	}
	if o.DryRun || created+changed+deleted == 0 {
		return nil
	}
	if err := plan.Apply(ctx, api, o.Stdout); err != nil {
		return err
	}
	if deleted > 0 {
		_, err = fmt.Fprintf(o.Stdout, "applied: %d created, %d changed, %d deleted, %d unchanged\n", created, changed, deleted, unchanged)
	} else {
		_, err = fmt.Fprintf(o.Stdout, "applied: %d created, %d changed, %d unchanged\n", created, changed, unchanged)
	}
	return err
}

// ExportTo writes the server's state as a description: into dir, one
// file per kind, or to w when dir is "". Notes (users left out) go to
// stderr.
func ExportTo(ctx context.Context, api API, dir string, w, stderr io.Writer) error {
	objs, usersSkipped, err := Export(ctx, api)
	if err != nil {
		return err
	}
	if usersSkipped {
		fmt.Fprintln(stderr, "note: users are not exported: reading them needs an admin token")
	}
	if dir == "" {
		_, err := w.Write(Encode(objs))
		return err
	}
	files, err := WriteDir(dir, objs)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%d objects in %s\n", len(objs), strings.Join(files, ", "))
	return err
}
