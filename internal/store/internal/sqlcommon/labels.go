package sqlcommon

import (
	"context"
	"database/sql"

	"github.com/drover/drover/internal/fleet"
)

// Labels implements fleet.LabelStore on the labels and device_labels
// tables.
type Labels struct{ *Base }

var _ fleet.LabelStore = (*Labels)(nil)

// LoadLabels implements fleet.LabelStore.
func (a *Labels) LoadLabels(ctx context.Context, each func(deviceID uint64, labelID uint16) error) ([]fleet.Label, error) {
	rows, err := a.R.QueryContext(ctx, `SELECT id, name, live_filter FROM labels ORDER BY id`)
	if err != nil {
		return nil, err
	}
	var out []fleet.Label
	for rows.Next() {
		var l fleet.Label
		var name, filter []byte
		if err := rows.Scan(&l.ID, &name, &filter); err != nil {
			rows.Close()
			return nil, err
		}
		l.Name, l.Filter = string(name), string(filter)
		out = append(out, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = a.R.QueryContext(ctx, `SELECT device_id, label_id FROM device_labels`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var dev uint64
		var id uint16
		if err := rows.Scan(&dev, &id); err != nil {
			return nil, err
		}
		if err := each(dev, id); err != nil {
			return nil, err
		}
	}
	return out, rows.Err()
}

// MaxLabelID implements fleet.LabelStore.
func (a *Labels) MaxLabelID(ctx context.Context) (uint16, error) {
	id, err := a.maxID(ctx, "labels", "label")
	return uint16(min(id, 1<<16-1)), err
}

// CreateLabel implements fleet.LabelStore.
func (a *Labels) CreateLabel(ctx context.Context, l fleet.Label) error {
	_, err := a.exec(ctx, a.D.q(`INSERT INTO labels (id, name, live_filter) VALUES (?, ?, ?)`), l.ID, l.Name, l.Filter)
	return err
}

// SetLabelFilter implements fleet.LabelStore.
func (a *Labels) SetLabelFilter(ctx context.Context, id uint16, filter string) error {
	_, err := a.exec(ctx, a.D.q(`UPDATE labels SET live_filter = ? WHERE id = ?`), filter, id)
	return err
}

// DeleteLabel implements fleet.LabelStore.
func (a *Labels) DeleteLabel(ctx context.Context, id uint16) error {
	return a.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, a.D.q(`DELETE FROM device_labels WHERE label_id = ?`), id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, a.D.q(`DELETE FROM labels WHERE id = ?`), id); err != nil {
			return err
		}
		return a.mark(ctx, tx, "label", uint64(id))
	})
}

// AssignLabel implements fleet.LabelStore.
func (a *Labels) AssignLabel(ctx context.Context, id uint16, deviceIDs []uint64, on bool) error {
	q := `DELETE FROM device_labels WHERE label_id = ? AND device_id = ?`
	if on {
		q = a.D.insertIgnore(`INSERT INTO device_labels (label_id, device_id) VALUES (?, ?)`)
	}
	return a.execEach(ctx, q, len(deviceIDs), func(i int) ([]any, error) { return []any{id, deviceIDs[i]}, nil })
}
