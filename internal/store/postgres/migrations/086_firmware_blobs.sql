-- Cluster mode (docs/firmware.md#firmware-files-in-a-cluster): an uploaded
-- firmware file is kept in the database as well, in chunks of 1 MiB, so
-- that a node that lacks it fetches it once into its --firmware-dir (and
-- checks its SHA-256) before serving it. One file per content (sha256),
-- whatever the artifacts that name it. Firmware images are compressed
-- already: stored as they are.
CREATE TABLE firmware_blobs (
	sha256 text    NOT NULL,
	n      integer NOT NULL, -- chunk number, from 0
	data   bytea   NOT NULL,
	PRIMARY KEY (sha256, n)
);
-- +step
ALTER TABLE firmware_blobs ALTER COLUMN data SET STORAGE EXTERNAL;
