-- Runtime settings: tunables an operator changes without a
-- restart, for every instance on the database, kept across restarts.
-- table_name '' is the global setting; otherwise a table as the policy names
-- it. Values are text, checked by `inboxkeeper set` exactly like the
-- environment variable of the same name.
CREATE TABLE inboxkeeper.settings (
    table_name text        NOT NULL DEFAULT '',
    key        text        NOT NULL,
    value      text        NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text        NOT NULL DEFAULT current_user,
    reason     text        NOT NULL,
    PRIMARY KEY (table_name, key)
);

-- Every change, for audit: who (the database role), why, when, from what to
-- what. A NULL old value was not set; a NULL new value is an unset. The
-- highest id is also how instances notice a change before their next batch.
CREATE TABLE inboxkeeper.settings_history (
    id         bigserial   PRIMARY KEY,
    table_name text        NOT NULL,
    key        text        NOT NULL,
    old_value  text,
    new_value  text,
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text        NOT NULL DEFAULT current_user,
    reason     text        NOT NULL
);
