-- Partitions the daemon detached, from the moment it decides to detach one
-- until it drops it. A row is written before DETACH starts, so a partition
-- detached by a pass that died before recording it is still found and
-- dropped later; detached_at is set once the partition is no longer attached.
CREATE TABLE inboxkeeper.partitions (
    table_name       text        NOT NULL,   -- the parent, canonical spelling
    partition_schema text        NOT NULL,
    partition_name   text        NOT NULL,
    lower_bound      timestamptz NOT NULL,
    upper_bound      timestamptz NOT NULL,
    detach_started   timestamptz NOT NULL,
    detached_at      timestamptz,
    keys_copied      bigint,                 -- permanent keys copied out before the drop
    dropped_at       timestamptz,
    PRIMARY KEY (partition_schema, partition_name, detach_started)
);

CREATE INDEX partitions_pending_idx ON inboxkeeper.partitions (table_name) WHERE dropped_at IS NULL;
