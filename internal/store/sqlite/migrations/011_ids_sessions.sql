-- "key" is reserved in MariaDB: the same queries run on every backend.
ALTER TABLE settings RENAME COLUMN key TO name;
-- +step
-- The highest ID ever handed out per kind, raised when rows are deleted,
-- so that a deleted rule's, event's or label's ID is never used again.
CREATE TABLE id_marks (
	kind TEXT    PRIMARY KEY,
	high INTEGER NOT NULL
);
-- +step
INSERT INTO id_marks (kind, high) VALUES ('rule', 0), ('event', 0), ('label', 0);
-- +step
-- Dashboard sessions by the SHA-256 of their ID; the ID itself is never stored.
CREATE TABLE sessions (
	id_hash BLOB    PRIMARY KEY,
	csrf    TEXT    NOT NULL,
	expires INTEGER NOT NULL -- unix ms
) WITHOUT ROWID;
