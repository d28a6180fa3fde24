package config

import (
	"reflect"
	"strings"
)

// Published is what an instance tells the others of the environment it
// runs with (the lease row: status and settings run from another shell
// read it there): every variable its environment sets, as the environment
// writes it, connection strings without their secrets (RedactURL). isSet
// says whether the environment sets a variable (os.LookupEnv).
func (c Config) Published(isSet func(name string) bool) map[string]string {
	out := map[string]string{}
	rv := reflect.ValueOf(c)
	for _, v := range variables() {
		if !isSet(v.name) {
			continue
		}
		val := format(rv.Field(v.index))
		if v.secret && val != "" {
			val = redactField(rv.Field(v.index).Interface())
		}
		out[v.name] = val
	}
	return out
}

// AsPublished is the configuration of the instance that published p
// (Published): p's values, and the default of every variable p does not
// set. A process cannot know another's connection strings: those it
// connects with itself (DATABASE_URL, its file, SESSION_DATABASE_URL) stay
// c's; the standbys (REPLICA_URLS) are c's where c names the same ones
// (their redacted forms agree), and otherwise left empty and named in
// unknown. A value that does not parse is left at c's and named in
// unknown too (a newer binary's).
func (c Config) AsPublished(p map[string]string) (out Config, unknown []string) {
	out = c
	rv := reflect.ValueOf(&out).Elem()
	own := reflect.ValueOf(c)
	for _, v := range variables() {
		switch v.name {
		case Prefix + "_DATABASE_URL", Prefix + "_DATABASE_URL_FILE", Prefix + "_SESSION_DATABASE_URL":
			continue
		}
		value, set := p[v.name]
		if !set {
			value = v.def
		}
		f := rv.Field(v.index)
		mine := format(own.Field(v.index))
		if v.secret && mine != "" {
			mine = redactField(own.Field(v.index).Interface())
		}
		switch {
		case value == "":
			f.Set(reflect.Zero(f.Type()))
			continue
		case v.secret && mine != value:
			f.Set(reflect.Zero(f.Type()))
			unknown = append(unknown, v.name)
			continue
		case v.secret:
			continue // the same standbys: c's, with their passwords
		}
		if f.Kind() == reflect.Slice {
			var list []string
			for _, s := range strings.Split(value, ",") {
				if s = strings.TrimSpace(s); s != "" {
					list = append(list, s)
				}
			}
			f.Set(reflect.ValueOf(list))
			continue
		}
		if err := setField(f, value); err != nil {
			f.Set(own.Field(v.index))
			unknown = append(unknown, v.name)
		}
	}
	return out, unknown
}
