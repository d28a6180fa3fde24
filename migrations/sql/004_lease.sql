-- One active instance per database: a lease that instances take over when
-- it runs out. Statements are single and autocommit, so the lease works
-- through PgBouncer in transaction mode (an advisory session lock would not).
CREATE TABLE inboxkeeper.lease (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    holder      text        NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
