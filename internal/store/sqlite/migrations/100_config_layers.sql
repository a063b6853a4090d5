-- Configuration layers (internal/fleet/layers.go, docs/configuration.md):
-- every revision of each device's and label's values and of each device
-- type's schema; the newest revision of a layer is its current values,
-- or its deletion. body is JSON ('null' for a deletion); at is unix ms.
CREATE TABLE config_layers (
	kind     TEXT    NOT NULL, -- device, label, schema
	name     TEXT    NOT NULL, -- device ID, label name, device type
	rev      INTEGER NOT NULL,
	priority INTEGER NOT NULL,
	body     TEXT    NOT NULL,
	deleted  INTEGER NOT NULL,
	by_whom  TEXT    NOT NULL,
	at       INTEGER NOT NULL,
	note     TEXT    NOT NULL,
	PRIMARY KEY (kind, name, rev)
) WITHOUT ROWID;
