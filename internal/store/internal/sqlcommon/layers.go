package sqlcommon

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/drover/drover/internal/fleet"
)

// Layers implements fleet.LayerStore on the config_layers table: every
// revision of every configuration layer, the newest one of a layer being
// its current values (or its deletion).
type Layers struct{ *Base }

var _ fleet.LayerStore = (*Layers)(nil)

const layerColumns = `kind, name, rev, priority, body, deleted, by_whom, at, note`

// LoadConfigLayers implements fleet.LayerStore.
func (a *Layers) LoadConfigLayers(ctx context.Context) ([]fleet.ConfigLayer, error) {
	return a.query(ctx, `SELECT `+layerColumns+` FROM config_layers c WHERE deleted = 0 AND rev =
		(SELECT max(rev) FROM config_layers m WHERE m.kind = c.kind AND m.name = c.name) ORDER BY kind, name`)
}

// LayerRevisions implements fleet.LayerStore.
func (a *Layers) LayerRevisions(ctx context.Context, kind fleet.LayerKind, name string) ([]fleet.ConfigLayer, error) {
	return a.query(ctx, a.D.q(`SELECT `+layerColumns+` FROM config_layers WHERE kind = ? AND name = ? ORDER BY rev`), string(kind), name)
}

func (a *Layers) query(ctx context.Context, q string, args ...any) ([]fleet.ConfigLayer, error) {
	rows, err := a.R.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []fleet.ConfigLayer{}
	for rows.Next() {
		var c fleet.ConfigLayer
		var kind, name, body, by, note []byte
		var deleted int
		var at int64
		if err := rows.Scan(&kind, &name, &c.Rev, &c.Priority, &body, &deleted, &by, &at, &note); err != nil {
			return nil, err
		}
		c.Kind, c.Name, c.Values, c.Deleted = fleet.LayerKind(kind), string(name), json.RawMessage(body), deleted != 0
		c.By, c.At, c.Note = string(by), fromMS(at), string(note)
		out = append(out, c)
	}
	return out, rows.Err()
}

// AddLayerRevision implements fleet.LayerStore: the next number of the
// layer, settled by the primary key as AddProfileRevision's.
func (a *Layers) AddLayerRevision(ctx context.Context, r fleet.ConfigLayer) (fleet.ConfigLayer, error) {
	ins := a.D.q(a.D.insertIgnore(`INSERT INTO config_layers (` + layerColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`))
	body := string(r.Values)
	if r.Deleted || body == "" {
		body = "null"
	}
	deleted := 0
	if r.Deleted {
		deleted = 1
	}
	for range revisionTries {
		stored := false
		err := a.tx(ctx, func(tx *sql.Tx) error {
			var n sql.NullInt64
			if err := tx.QueryRowContext(ctx, a.D.q(`SELECT max(rev) FROM config_layers WHERE kind = ? AND name = ?`), string(r.Kind), r.Name).Scan(&n); err != nil {
				return err
			}
			r.Rev = int(n.Int64) + 1
			res, err := tx.ExecContext(ctx, ins, string(r.Kind), r.Name, r.Rev, r.Priority, body, deleted, r.By, ms(r.At), r.Note)
			if err != nil {
				return err
			}
			k, err := res.RowsAffected()
			stored = k == 1
			return err
		})
		if err != nil || stored {
			r.Values = json.RawMessage(body)
			return r, err
		}
	}
	return r, fmt.Errorf("%s layer %q: no free revision number after %d tries", r.Kind, r.Name, revisionTries)
}
