-- The control schema: holds, replay markers and the version of this schema.
-- Table names are stored in their canonical SQL spelling (see policy.QualifiedName).

CREATE TABLE inboxkeeper.holds (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    table_name  text        NOT NULL,
    scope_value text,
    event_from  timestamptz,
    event_to    timestamptz,
    reason      text        NOT NULL CHECK (reason <> ''),
    owner       text        NOT NULL CHECK (owner <> ''),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    released_at timestamptz,
    CHECK ((event_from IS NULL) = (event_to IS NULL)),
    CHECK (event_from < event_to)
);

-- The deleter reads the active holds of one table before every batch.
CREATE INDEX holds_active_idx ON inboxkeeper.holds (table_name) WHERE released_at IS NULL;

CREATE TABLE inboxkeeper.replays (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    table_name  text        NOT NULL,
    scope_value text        NOT NULL,
    event_from  timestamptz NOT NULL,
    event_to    timestamptz NOT NULL,
    owner       text        NOT NULL CHECK (owner <> ''),
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CHECK (event_from < event_to)
);

CREATE INDEX replays_active_idx ON inboxkeeper.replays (table_name) WHERE finished_at IS NULL;
