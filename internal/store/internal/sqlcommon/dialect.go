// Package sqlcommon is the part of the store contract that the SQL
// adapters share word for word, over database/sql, with a Dialect for
// what differs: placeholders, upserts and bounded deletes. Each purpose is
// one type in the file of its name, on a Base (base.go: the pools, the
// instance lock's check, ID high-water marks): Alerts (rules, alert and
// sync events), Settings, Labels, Sessions, Access (users, API tokens,
// audit log), Commands, Firmware (artifacts, rollouts, profile
// revisions), Layers (configuration layers), which Tables composes; Policy (the profile policy), Samples
// (history reads on PostgreSQL and MariaDB) and Load (devices and
// profiles at start) stand on their own.
package sqlcommon

import (
	"strconv"
	"strings"
)

// Dialect is what differs between the SQL databases in these queries.
type Dialect struct {
	// Dollar: placeholders are $1, $2, … (PostgreSQL), not ?.
	Dollar bool
	// DuplicateKey: upserts are ON DUPLICATE KEY UPDATE (MariaDB), not
	// ON CONFLICT; bounded deletes are DELETE … LIMIT, as MariaDB allows no
	// LIMIT in an IN subquery.
	DuplicateKey bool
	// RowID orders rows by insertion: "rowid" (SQLite) or "id".
	RowID string
}

// Dialects of the adapters.
var (
	SQLite   = Dialect{RowID: "rowid"}
	Postgres = Dialect{Dollar: true, RowID: "id"}
	MariaDB  = Dialect{DuplicateKey: true, RowID: "id"}
)

// q rebinds ? placeholders (none occur in literals here).
func (d Dialect) q(s string) string {
	if !d.Dollar {
		return s
	}
	var b strings.Builder
	n := 0
	for _, r := range s {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// upsert is the tail of an INSERT that replaces cols of the row whose key
// clashes.
func (d Dialect) upsert(key string, cols ...string) string {
	set := make([]string, len(cols))
	for i, c := range cols {
		if d.DuplicateKey {
			set[i] = c + " = VALUES(" + c + ")"
		} else {
			set[i] = c + " = excluded." + c
		}
	}
	if d.DuplicateKey {
		return " ON DUPLICATE KEY UPDATE " + strings.Join(set, ", ")
	}
	return " ON CONFLICT (" + key + ") DO UPDATE SET " + strings.Join(set, ", ")
}

// insertIgnore turns "INSERT INTO …" into one that skips duplicate keys.
func (d Dialect) insertIgnore(insert string) string {
	if d.DuplicateKey {
		return strings.Replace(insert, "INSERT INTO", "INSERT IGNORE INTO", 1)
	}
	return insert + " ON CONFLICT DO NOTHING"
}

// deleteSome deletes at most n rows of table matching where.
func (d Dialect) deleteSome(table, where string, n int) string {
	if d.DuplicateKey {
		return "DELETE FROM " + table + " WHERE " + where + " LIMIT " + strconv.Itoa(n)
	}
	return "DELETE FROM " + table + " WHERE " + d.RowID + " IN (SELECT " + d.RowID + " FROM " + table + " WHERE " + where +
		" LIMIT " + strconv.Itoa(n) + ")"
}
