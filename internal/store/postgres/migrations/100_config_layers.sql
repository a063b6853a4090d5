-- Configuration layers (internal/fleet/layers.go, docs/configuration.md):
-- every revision of each device's and label's values and of each device
-- type's schema; the newest revision of a layer is its current values,
-- or its deletion. body is JSON ('null' for a deletion); at is unix ms.
CREATE TABLE config_layers (
	kind     text     NOT NULL, -- device, label, schema
	name     text     NOT NULL, -- device ID, label name, device type
	rev      integer  NOT NULL,
	priority integer  NOT NULL,
	body     text     NOT NULL,
	deleted  smallint NOT NULL,
	by_whom  text     NOT NULL,
	at       bigint   NOT NULL,
	note     text     NOT NULL,
	PRIMARY KEY (kind, name, rev)
);
