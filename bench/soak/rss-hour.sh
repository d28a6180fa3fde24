#!/bin/bash
# rss-hour.sh: the daemon's memory over a long run under a steady writer,
# one cleaner only (bench/soak runs three side by side and is judged over
# 10 minutes; this answers "does RSS level off?" over an hour or more).
#
#   DATABASE_URL=postgres://user:pw@host:port/db POLICY=inboxkeeper.yaml \
#     DURATION=3600 RATE=1000 bench/soak/rss-hour.sh > rss.tsv
#
# The database must hold the recommended inbox (inbox/schema/plain.sql)
# with a payload column (ALTER TABLE public.consumer_inbox ADD COLUMN
# payload text), and POLICY must name it. pgbench inserts RATE rows a
# second that expire after 20 s; `inboxkeeper run` (built from this
# checkout) cleans them with INTERVAL=5s; every 30 s a line gives the
# seconds since the start, VmRSS, its anonymous and file-mapped parts
# (kB, /proc), and the Go heap's in-use and system bytes and the
# goroutines (from /metrics).
set -euo pipefail
: "${DATABASE_URL:?set DATABASE_URL}" "${POLICY:?set POLICY}"
DURATION=${DURATION:-3600} RATE=${RATE:-1000}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
cd "$(dirname "$0")/../.."
go build -o "$dir/inboxkeeper" ./cmd/inboxkeeper
cat > "$dir/ins.sql" <<'SQL'
\set c random(0,3)
INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, outcome, event_time, first_seen_at, remember_until, payload)
VALUES ('c' || :c, gen_random_uuid()::text, '\x00', 'applied', now(), now(), now() + interval '20 s', repeat('x', 300));
SQL
export INBOXKEEPER_DATABASE_URL=$DATABASE_URL INBOXKEEPER_POLICY_FILE=$POLICY INBOXKEEPER_INTERVAL=5s INBOXKEEPER_METRICS_ADDR=127.0.0.1:19187
"$dir/inboxkeeper" migrate >&2
"$dir/inboxkeeper" run 2>"$dir/daemon.log" &
daemon=$!
pgbench -n -c 4 -j 2 -R "$RATE" -T "$DURATION" -f "$dir/ins.sql" "$DATABASE_URL" >"$dir/pgbench.log" 2>&1 &
writer=$!
echo "seconds vmrss_kb rss_anon_kb rss_file_kb heap_inuse_bytes heap_sys_bytes goroutines"
start=$(date +%s)
while kill -0 "$writer" 2>/dev/null; do
	m=$(curl -s 127.0.0.1:19187/metrics || true)
	g() { awk -v k="$1" '$1==k{printf "%d", $2}' <<<"$m"; }
	s=$(awk '/^VmRSS|^RssAnon|^RssFile/{printf "%s ", $2}' "/proc/$daemon/status")
	echo "$(($(date +%s) - start)) $s$(g go_memstats_heap_inuse_bytes) $(g go_memstats_heap_sys_bytes) $(g go_goroutines)"
	sleep 30
done
tail -3 "$dir/pgbench.log" >&2
