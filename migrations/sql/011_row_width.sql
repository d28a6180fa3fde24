-- row_width sizes an average row of rel for a role that may read only some
-- of its columns (SELECT granted column by column, deploy/sql/role.sql's
-- private_columns): pg_stats shows a role only the columns it may read, and
-- a sample of whole rows needs them all. It runs with its owner's rights
-- (the role that runs migrate, normally the tables' owner) and returns
-- sizes only, never a value; it answers a caller only for a table the
-- caller may read some column of.
--   columns       the table's columns
--   with_stats    how many of them pg_stats has statistics for
--   stats_width   their average width, NULLs weighed out
--   sample_width  when some column has no statistics and newest_by is
--                 given: the average size of the newest 1,000 rows by that
--                 column (a TOASTed value counts in full)
CREATE FUNCTION inboxkeeper.row_width(rel regclass, newest_by name,
    OUT columns int, OUT with_stats int, OUT stats_width float8, OUT sample_width float8)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $row_width$
BEGIN
    IF NOT has_any_column_privilege(session_user, rel, 'SELECT') THEN
        RAISE EXCEPTION 'permission denied: % may read no column of %', session_user, rel
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT count(*) INTO columns FROM pg_attribute a
     WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped;
    SELECT count(*), coalesce(sum(s.avg_width * (1 - s.null_frac)), 0)::float8 INTO with_stats, stats_width
      FROM pg_stats s JOIN pg_class c ON c.relname = s.tablename JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname
     WHERE c.oid = rel AND NOT s.inherited;
    IF with_stats < columns AND newest_by IS NOT NULL THEN
        EXECUTE format('SELECT coalesce(avg(pg_column_size(r.*)), 0)::float8 FROM (SELECT * FROM %s ORDER BY %I DESC NULLS LAST LIMIT 1000) r',
                       rel, newest_by) INTO sample_width;
    END IF;
END
$row_width$;
REVOKE EXECUTE ON FUNCTION inboxkeeper.row_width(regclass, name) FROM PUBLIC;
