package config

import (
	"reflect"
	"time"
)

// The defaults a package applies to an option left zero are the
// environment's, written here once: the services (batchloop, partitions,
// holds, service, dbconn, throttle) read these constants, and the
// environment's table (envDefaults below) is built from them.
const (
	DefaultBatchSize          = 5000
	DefaultLockTimeout        = 500 * time.Millisecond // a batch transaction's
	DefaultDDLLockTimeout     = 100 * time.Millisecond // a partition DDL statement's
	DefaultStatementTimeout   = 30 * time.Second
	DefaultFenceTimeout       = 30 * time.Second
	DefaultIdleTimeout        = 10 * time.Second
	DefaultHeartbeatInterval  = 250 * time.Millisecond
	DefaultMaxReplicaLag      = time.Second
	DefaultMaxReplicaLagBytes = ByteSize(64 << 20)
	// DefaultCompactWALRate keeps an application's synchronous commits
	// within a quarter of their p99 beside a compaction (bench/compact).
	DefaultCompactWALRate = ByteSize(512 << 10)
	DefaultThrottleResume = 0.5
)

// The values of EXPIRY_STRATEGY; the deleter's expiry.Strategy constants are
// these.
const (
	StrategyAuto   = "auto"
	StrategySweep  = "sweep"
	StrategyExpiry = "expiry"
)

// ExpiryStrategies are the values of EXPIRY_STRATEGY (expiry.Strategies is
// built from them).
var ExpiryStrategies = []string{StrategyAuto, StrategySweep, StrategyExpiry}

// envDefaults is the configuration of an empty environment: the one table of
// every variable's default. A variable left out (an empty string or list)
// has none; every other value, zero included, is the default `help env`
// and the reference show (variables: format).
var envDefaults = Config{
	PolicyFile:       "./inboxkeeper.yaml",
	BatchSize:        DefaultBatchSize,
	BatchPause:       0,
	Interval:         time.Minute,
	RunTime:          0,
	LockTimeout:      DefaultLockTimeout,
	StatementTimeout: DefaultStatementTimeout,
	DDLLockTimeout:   DefaultDDLLockTimeout,
	FenceTimeout:     DefaultFenceTimeout,
	IdleTimeout:      DefaultIdleTimeout,
	MetricsAddr:      "127.0.0.1:9610",
	LogFormat:        "text",
	LogLevel:         "info",
	ExpiryStrategy:   StrategyAuto,
	SweepPrefetch:    true,

	HeartbeatInterval:  DefaultHeartbeatInterval,
	MaxReplicaLag:      DefaultMaxReplicaLag,
	MaxReplicaLagBytes: DefaultMaxReplicaLagBytes,
	ReplicaFailOpen:    false,
	ReplicaWait:        time.Minute,
	MaxSlotLagBytes:    1 << 30,
	BatchTarget:        200 * time.Millisecond,
	BatchSizeMin:       100,
	BatchSizeMax:       50000,
	ActiveTZ:           "UTC",
	ThrottleResume:     DefaultThrottleResume,

	VacuumDeadRatio: 0.1,
	CompactWALRate:  DefaultCompactWALRate,

	LeaseTTL: 15 * time.Second,
}

// defaultText is the default of field i as the environment writes it; ""
// for a text or a list without one.
func defaultText(i int) string {
	f := reflect.ValueOf(envDefaults).Field(i)
	if (f.Kind() == reflect.String || f.Kind() == reflect.Slice) && f.Len() == 0 {
		return ""
	}
	return format(f)
}
