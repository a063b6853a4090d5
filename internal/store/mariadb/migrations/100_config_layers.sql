-- Configuration layers (internal/fleet/layers.go, docs/configuration.md):
-- every revision of each device's and label's values and of each device
-- type's schema; the newest revision of a layer is its current values,
-- or its deletion. body is JSON ('null' for a deletion); at is unix ms.
CREATE TABLE IF NOT EXISTS config_layers (
	kind     VARBINARY(16)   NOT NULL, -- device, label, schema
	name     VARBINARY(255)  NOT NULL, -- device ID, label name, device type
	rev      INT             NOT NULL,
	priority INT             NOT NULL,
	body     LONGBLOB        NOT NULL,
	deleted  TINYINT         NOT NULL,
	by_whom  VARBINARY(255)  NOT NULL,
	at       BIGINT          NOT NULL,
	note     VARBINARY(1024) NOT NULL,
	PRIMARY KEY (kind, name, rev)
) ENGINE=InnoDB;
