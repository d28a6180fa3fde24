package tiering_test

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxkeeper/inboxkeeper/expiry"
	"github.com/inboxkeeper/inboxkeeper/internal/domain/batchloop"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/catalog"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/service"
	"github.com/inboxkeeper/inboxkeeper/tiering"
)

// The demoter's tests run the deleter over the tables they demote; the
// deleter imports tiering (the permanent keys its DELETE writes), so it is
// reached from here.
func init() {
	tiering.RunDeleter = func(pool *pgxpool.Pool, table *catalog.Table, now time.Time) (tiering.DeleterResult, error) {
		res, err := expiry.New(pool, []*catalog.Table{table}, expiry.Options{Settings: batchloop.Settings{Base: service.Base{Clock: service.At(now)}}}).RunPass(context.Background())
		if err != nil {
			return tiering.DeleterResult{}, err
		}
		r := res[0]
		return tiering.DeleterResult{Deleted: r.Deleted, PermanentKeys: r.PermanentKeys, ProtectedByReplays: r.ProtectedByReplays, Err: r.Err}, nil
	}
}
