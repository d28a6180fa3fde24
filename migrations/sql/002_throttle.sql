-- The throttle: a heartbeat row written on the primary and read on standbys
-- (its age there is their apply lag), and a manual pause every instance obeys.

CREATE TABLE inboxkeeper.heartbeat (
    id   boolean PRIMARY KEY DEFAULT true CHECK (id),
    beat timestamptz NOT NULL
);

CREATE TABLE inboxkeeper.pause (
    id        boolean PRIMARY KEY DEFAULT true CHECK (id),
    reason    text        NOT NULL CHECK (reason <> ''),
    paused_by text        NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    until     timestamptz
);
