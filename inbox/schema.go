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
