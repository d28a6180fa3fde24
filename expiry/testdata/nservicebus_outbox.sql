-- NServiceBus SQL persistence outbox, endpoint prefix "Sales_" (from shared/fixtures).
CREATE TABLE "Sales_OutboxData" (
    "MessageId" varchar(200) NOT NULL PRIMARY KEY,
    "Dispatched" boolean NOT NULL DEFAULT false,
    "DispatchedAt" timestamp,
    "PersistenceVersion" varchar(23) NOT NULL,
    "Operations" jsonb NOT NULL
);
CREATE INDEX "Sales_OutboxData_DispatchedAt" ON "Sales_OutboxData" ("DispatchedAt");
CREATE INDEX "Sales_OutboxData_Dispatched" ON "Sales_OutboxData" ("Dispatched");
