package compact

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/vacuum"
)

// ErrRefused is a table compaction will not touch as it stands: a moved
// row is an UPDATE, which the table's UPDATE triggers and its publications
// would see, and the compaction's VACUUM needs a role that may vacuum it.
// Nothing was changed.
var ErrRefused = errors.New("compaction refused")

// refusalSQL lists the table's user triggers that fire on UPDATE (an
// enabled trigger of the table's own, not the internal ones of a foreign
// key, which a no-op update leaves alone) and the publications that
// publish its updates, and whether this role may UPDATE its expiry column
// (the one the no-op update sets).
const refusalSQL = `
SELECT coalesce((SELECT array_agg(tg.tgname::text ORDER BY tg.tgname) FROM pg_trigger tg
                 WHERE tg.tgrelid = c.oid AND NOT tg.tgisinternal AND tg.tgenabled <> 'D' AND tg.tgtype & 16 <> 0), '{}'),
       coalesce((SELECT array_agg(DISTINCT p.pubname::text) FROM pg_publication_tables pt JOIN pg_publication p ON p.pubname = pt.pubname
                 WHERE pt.schemaname = n.nspname AND pt.tablename = c.relname AND p.pubupdate), '{}'),
       has_column_privilege(c.oid, $2, 'UPDATE')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`

// Allow is what a table's compaction may do although others see it.
type Allow struct {
	Triggers    bool // its UPDATE triggers fire for every moved row
	Publication bool // its publications send every moved row as an update
}

// check refuses t, with ErrRefused and what to do about it, when it has
// user UPDATE triggers or publications that allow does not accept, or when
// this role may not update its expiry column or vacuum it.
func check(ctx context.Context, q catalog.Querier, t *catalog.Table, allow Allow) error {
	var triggers, pubs []string
	var mayUpdate bool
	if err := q.QueryRow(ctx, refusalSQL, t.OID, t.Expiry.Name).Scan(&triggers, &pubs, &mayUpdate); err != nil {
		return fmt.Errorf("read the triggers and publications of %s: %w", t.Name, err)
	}
	var why []string
	if len(triggers) > 0 && !allow.Triggers {
		why = append(why, fmt.Sprintf("it has UPDATE triggers (%s), which would fire for every row moved; "+
			"allow it with --allow-triggers or compact.allow_triggers in the policy once they do nothing harmful on an update that changes no value", strings.Join(triggers, ", ")))
	}
	if len(pubs) > 0 && !allow.Publication {
		why = append(why, fmt.Sprintf("it is in publications that publish updates (%s), whose subscribers would receive every row moved as an update; "+
			"allow it with --allow-publication or compact.allow_publication in the policy", strings.Join(pubs, ", ")))
	}
	if !mayUpdate {
		why = append(why, fmt.Sprintf("this role may not UPDATE its column %s, which the moves set to its own value (deploy/sql/role.sql grants it)", t.Expiry.Quoted))
	}
	if len(why) == 0 {
		ok, err := vacuum.MayVacuum(ctx, q, t)
		if err != nil {
			return fmt.Errorf("may this role vacuum %s: %w", t.Name, err)
		}
		if !ok {
			why = append(why, "this role may not VACUUM it, and only a VACUUM gives the emptied pages back: run it as the table's owner (or, from PostgreSQL 17, a role granted MAINTAIN on it)")
		}
	}
	if len(why) > 0 {
		return fmt.Errorf("%w for %s: %s; nothing was changed", ErrRefused, t.Name, strings.Join(why, "; "))
	}
	return nil
}
