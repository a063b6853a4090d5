-- The server holding the instance lock (GET_LOCK on a dedicated
-- connection) records itself here; commits check the token, so a server
-- that lost the lock while the database was away cannot write after
-- another one took over.
CREATE TABLE IF NOT EXISTS instance_lock (
	id    INT          NOT NULL PRIMARY KEY,
	token VARCHAR(64)  NOT NULL,
	host  VARCHAR(255) NOT NULL,
	pid   BIGINT       NOT NULL,
	since BIGINT       NOT NULL
) ENGINE=InnoDB;
