-- Tiering: a hold says what it blocks. 'all' (a legal hold, the
-- default and what every hold written before this migration did) blocks the
-- demotion of payload and the deletion of the row; 'delete' blocks only the
-- deletion, like a replay marker: a replay needs the identity, not the payload.
ALTER TABLE inboxkeeper.holds
    ADD COLUMN blocks text NOT NULL DEFAULT 'all' CHECK (blocks IN ('delete', 'all'));
