-- NServiceBus SQL persistence outbox table for one endpoint (prefix "Sales_"), as its
-- create script makes it: the table named from the prefix, the indexes named without it
-- ("Index_DispatchedAt", "Index_Dispatched"), so that a second endpoint in the same
-- schema gets none of its own.
CREATE TABLE public."Sales_OutboxData" (
    "MessageId" character varying(200),
    "Dispatched" boolean NOT NULL DEFAULT false,
    "DispatchedAt" timestamp,
    "PersistenceVersion" character varying(23),
    "Operations" jsonb NOT NULL,
    PRIMARY KEY ("MessageId")
);
CREATE INDEX IF NOT EXISTS "Index_DispatchedAt" ON public."Sales_OutboxData" USING btree ("DispatchedAt" ASC NULLS LAST);
CREATE INDEX IF NOT EXISTS "Index_Dispatched" ON public."Sales_OutboxData" USING btree ("Dispatched" ASC NULLS LAST);
