package config

import (
	"reflect"
	"testing"
)

// Every default, written as help env and the reference show it, reads back
// as the table's value: what the docs print is what an empty environment
// runs with.
func TestDefaultsReadBack(t *testing.T) {
	clearEnv(t)
	loaded, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(loaded, Defaults()) {
		t.Errorf("an empty environment loads\n%#v\nthe table says\n%#v", loaded, Defaults())
	}
	for _, v := range variables() {
		if v.def == "" {
			continue
		}
		c, err := Config{}.Set(v.name, v.def)
		if err != nil {
			t.Errorf("%s: its default %q does not read back: %v", v.name, v.def, err)
			continue
		}
		got, want := reflect.ValueOf(c).Field(v.index).Interface(), reflect.ValueOf(envDefaults).Field(v.index).Interface()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: its default %q reads back as %v, the table says %v", v.name, v.def, got, want)
		}
	}
}
