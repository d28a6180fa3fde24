package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/sqlident"
	"github.com/inboxkeeper/inboxkeeper/migrations"
)

// Tiers demotes rows through storage tiers:
//
//	tiers:
//	  hot_for: 72h                         # full row: payload and diagnostics
//	  anchor: first_seen_at                # the column the hot window counts from
//	  payload_columns: [payload, headers]  # emptied in place (set to NULL) ...
//	  payload_table: public.inbox_payload  # ... or rows deleted from a side table
//	  permanent_key:                       # optional: kept after the row is deleted
//	    columns: [consumer, business_key]  # the compact business-operation key
//	    hash: payload_hash                 # optional: kept with it
//	    table: inboxkeeper.payments_keys   # optional; default inboxkeeper."keys_<schema>_<table>"
//
// hot: the full row. warm: the row without its payload. permanent: the key,
// written when the row is deleted.
type Tiers struct {
	HotFor         time.Duration
	Anchor         string
	PayloadColumns []string                // in-place layout; nil with PayloadTable
	PayloadTable   *sqlident.QualifiedName // side-table layout; nil with PayloadColumns
	PermanentKey   *PermanentKey           // nil: nothing is kept after deletion
}

// PermanentKey is the compact key kept after a row is deleted.
type PermanentKey struct {
	Columns []string
	Hash    string                 // "" when not kept
	Table   sqlident.QualifiedName // where the keys go (the default filled in)
}

// FirstSeenColumn is the date column every permanent key table has.
const FirstSeenColumn = "first_seen"

// DefaultKeyTable is where a table's permanent keys go when the policy names
// no table: inboxkeeper."keys_<schema>_<table>", within PostgreSQL's 63-byte
// identifier limit. A longer name is cut and ends in a hash of the whole
// name, so that two long names do not end up as one table.
func DefaultKeyTable(t sqlident.QualifiedName) sqlident.QualifiedName {
	name := "keys_" + t.Schema + "_" + t.Name
	const limit = 63
	if len(name) > limit {
		sum := sha256.Sum256([]byte(t.Schema + "\x00" + t.Name))
		suffix := "_" + hex.EncodeToString(sum[:4])
		cut := limit - len(suffix)
		// Do not cut a UTF-8 sequence in half.
		for cut > 0 && name[cut]&0xC0 == 0x80 {
			cut--
		}
		name = name[:cut] + suffix
	}
	return sqlident.QualifiedName{Schema: migrations.Schema, Name: name}
}

type rawTiers struct {
	HotFor         *Duration        `yaml:"hot_for"`
	Anchor         string           `yaml:"anchor"`
	PayloadColumns []string         `yaml:"payload_columns"`
	PayloadTable   string           `yaml:"payload_table"`
	PermanentKey   *rawPermanentKey `yaml:"permanent_key"`
}

type rawPermanentKey struct {
	Columns []string `yaml:"columns"`
	Hash    string   `yaml:"hash"`
	Table   string   `yaml:"table"`
}

// tiers checks the tiers section of table t (whose other fields are already
// decoded) and reports problems through fail.
func tiers(rt *rawTiers, t Table, fail func(field, format string, args ...any)) *Tiers {
	column := func(field, c string) bool {
		if err := checkColumn(c); err != nil {
			fail(field, "%v", err)
			return false
		}
		return true
	}
	out := &Tiers{Anchor: rt.Anchor}
	out.HotFor = RequiredPositive(rt.HotFor, "tiers.hot_for", "required: how long a row keeps its payload (e.g. 72h)", fail)
	if rt.Anchor == "" {
		fail("tiers.anchor", "required: the timestamp column the hot window counts from (e.g. first_seen_at)")
	} else {
		column("tiers.anchor", rt.Anchor)
	}

	// Columns a demotion must never empty: they identify the row, decide
	// its expiry, or are what holds match on.
	reserved := map[string]string{}
	for i, k := range t.Key {
		reserved[k] = fmt.Sprintf("key[%d]", i)
	}
	for _, c := range []struct{ col, field string }{
		{t.Scope, "scope"}, {t.EventTime, "event_time"}, {t.FirstSeen, "first_seen"},
		{t.ExpiryColumn(), "the expiry column"}, {rt.Anchor, "tiers.anchor"},
	} {
		if _, dup := reserved[c.col]; c.col != "" && !dup {
			reserved[c.col] = c.field
		}
	}
	if pk := rt.PermanentKey; pk != nil {
		for i, c := range pk.Columns {
			if _, dup := reserved[c]; c != "" && !dup {
				reserved[c] = fmt.Sprintf("tiers.permanent_key.columns[%d]", i)
			}
		}
	}

	switch {
	case rt.PayloadColumns != nil && rt.PayloadTable != "":
		fail("tiers.payload_table", "cannot be combined with payload_columns; use one")
	case rt.PayloadColumns == nil && rt.PayloadTable == "":
		fail("tiers", "payload_columns or payload_table is required: where the payload lives")
	case rt.PayloadTable != "":
		if q, ok := otherTable(rt.PayloadTable, t, "tiers.payload_table", "name the side table that holds the payload, or use payload_columns", fail); ok {
			out.PayloadTable = &q
		}
	default:
		if len(rt.PayloadColumns) == 0 {
			fail("tiers.payload_columns", "must list at least one column")
		}
		for i, c := range rt.PayloadColumns {
			field := fmt.Sprintf("tiers.payload_columns[%d]", i)
			if !column(field, c) {
				continue
			}
			if j := slices.Index(rt.PayloadColumns[:i], c); j >= 0 {
				fail(field, "column %q is already payload_columns[%d]", c, j)
				continue
			}
			if why, ok := reserved[c]; ok {
				fail(field, "column %q is %s: a demotion must not empty it", c, why)
			}
			if pk := rt.PermanentKey; pk != nil && pk.Hash == c {
				fail(field, "column %q is the permanent key's hash: the payload hash is never demoted separately from the identity it proves", c)
			}
		}
		out.PayloadColumns = rt.PayloadColumns
	}

	if pk := rt.PermanentKey; pk != nil {
		out.PermanentKey = permanentKey(pk, t, fail)
	}
	return out
}

func permanentKey(rp *rawPermanentKey, t Table, fail func(field, format string, args ...any)) *PermanentKey {
	pk := &PermanentKey{Columns: rp.Columns, Hash: rp.Hash}
	if len(rp.Columns) == 0 {
		fail("tiers.permanent_key.columns", "required: the columns of the compact key kept after the row is deleted")
	}
	clash := func(field, c string) {
		if c == FirstSeenColumn {
			fail(field, "column %q clashes with the %s date column every permanent key table has", c, FirstSeenColumn)
		}
	}
	for i, c := range rp.Columns {
		field := fmt.Sprintf("tiers.permanent_key.columns[%d]", i)
		if err := checkColumn(c); err != nil {
			fail(field, "%v", err)
			continue
		}
		if j := slices.Index(rp.Columns[:i], c); j >= 0 {
			fail(field, "column %q is already columns[%d]", c, j)
		}
		clash(field, c)
	}
	if rp.Hash != "" {
		if err := checkColumn(rp.Hash); err != nil {
			fail("tiers.permanent_key.hash", "%v", err)
		} else if slices.Contains(rp.Columns, rp.Hash) {
			fail("tiers.permanent_key.hash", "column %q is already one of the key columns", rp.Hash)
		}
		clash("tiers.permanent_key.hash", rp.Hash)
	}
	if t.Scope != "" && !slices.Contains(rp.Columns, t.Scope) {
		clash("scope", t.Scope)
	}
	if rp.Table == "" {
		pk.Table = DefaultKeyTable(t.Name)
		return pk
	}
	if q, ok := otherTable(rp.Table, t, "tiers.permanent_key.table", "name a table of its own", fail); ok {
		pk.Table = q
	}
	return pk
}

// otherTable parses name, the table of field, which must be another table
// than t (a side table of it); otherwise fail is told why, and what to
// name instead (instead), and ok is false.
func otherTable(name string, t Table, field, instead string, fail func(field, format string, args ...any)) (q sqlident.QualifiedName, ok bool) {
	q, err := sqlident.ParseQualifiedName(name)
	switch {
	case err != nil:
		fail(field, "%v", err)
	case q == t.Name:
		fail(field, "is the table itself; %s", instead)
	default:
		return q, true
	}
	return q, false
}

// permanentKey is t's permanent key, nil when it keeps none.
func (t Table) permanentKey() *PermanentKey {
	if t.Tiers == nil {
		return nil
	}
	return t.Tiers.PermanentKey
}
