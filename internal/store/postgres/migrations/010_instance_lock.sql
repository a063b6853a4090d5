-- The server holding the instance lock (a session advisory lock) records
-- itself here; commits check the token, so a server that lost the lock
-- while the database was away cannot write after another one took over.
CREATE TABLE instance_lock (
	id    integer PRIMARY KEY CHECK (id = 1),
	token text    NOT NULL,
	host  text    NOT NULL,
	pid   bigint  NOT NULL,
	since bigint  NOT NULL -- unix s
);
