package inbox

import _ "embed"

// PlainDDL creates the recommended inbox table, public.consumer_inbox, in its
// plain layout: the identity as primary key and one index on remember_until,
// which the daemon deletes by. Apply it in your own migration (rename the
// table and its index to taste) before `inboxkeeper migrate` and the policy
// name it. The project's own tests, benchmarks and deploy examples use this
// text, so it is the layout they prove.
//
//go:embed schema/plain.sql
var PlainDDL string

// PartitionedDDL creates the recommended inbox table partitioned by range of
// remember_until, for retiring whole months instead of deleting rows. It
// makes no partition: the daemon makes them ahead of time when the policy
// gives the table a partitions section. Without a unique index across
// partitions, the claim path serialises each identity with a lock instead.
//
//go:embed schema/partitioned.sql
var PartitionedDDL string

// PlainPolicy is a complete policy file for the recommended inbox table as
// PlainDDL creates it: the table's entry (the identity as key, consumer as
// the scope holds and replays match on, the event-time and first-receipt
// columns of the retention contract, and expiry by remember_until) and no
// retention section. Write it to the file INBOXKEEPER_POLICY_FILE names, or
// append your own entries or a retention: section; it ends with the entry's
// last line, so more of the entry (tiers:, partitions:) may follow too. The
// demo and the project's tests build their policies on it.
//
//go:embed schema/plain-policy.yaml
var PlainPolicy string
