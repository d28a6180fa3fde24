package pass

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// CheckExport refuses, before a pass, once's --metrics-file and
// --pushgateway that Export could not write to: found only when exporting,
// a bad value failed a pass that had already deleted rows.
func CheckExport(file, gateway string) error {
	if err := checkGateway(gateway); err != nil {
		return err
	}
	return checkMetricsFile(file)
}

// checkGateway refuses a --pushgateway that is not an http(s) URL with a
// host ("host:9091" is http://host:9091, as the push client reads it).
func checkGateway(gateway string) error {
	if gateway == "" {
		return nil
	}
	raw := gateway
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err == nil && (u.Scheme != "http" && u.Scheme != "https" || u.Hostname() == "") {
		err = errors.New("want http://host:port")
	}
	if err != nil {
		return Usagef("once: --pushgateway %q: %v", gateway, err)
	}
	return nil
}

// checkMetricsFile refuses a --metrics-file whose directory does not exist
// or cannot take the temporary file it is written through.
func checkMetricsFile(path string) error {
	if path == "" {
		return nil
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return Usagef("once: --metrics-file %s is a directory; name a file in it", path)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".inboxkeeper-check-*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return Usagef("once: --metrics-file %s: cannot write in %s: %v", path, dir, err)
	}
	_ = f.Close()
	_ = os.Remove(f.Name())
	return nil
}

// PushInstance names the series of the database at url at a Pushgateway,
// where each push replaces the last of the same name: the database
// (host:port/name, never a user or password) is the same from run to run,
// where a host name is not (a Job's pod has a new one every run, and each
// would leave a group behind whose last success goes stale).
func PushInstance(url string) string {
	c, err := pgconn.ParseConfig(url)
	if err != nil || c.Host == "" {
		return "inboxkeeper"
	}
	return fmt.Sprintf("%s:%d/%s", c.Host, c.Port, c.Database)
}
