package deploy_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/testfile"
)

const chartSchema = "helm/inboxkeeper/values.schema.json"

var updateSchema = flag.Bool("update-schema", false, "rewrite the env section of "+chartSchema+" from internal/platform/config")

// envSchema is the "env" section of the chart's values.schema.json,
// generated from the configuration: every variable the daemon reads, as
// `inboxkeeper help env` describes it, and no other name, so that a
// misspelt one (INBOXKEEPER_BATCH_SIZ) fails the release instead of the pod
// (exit 2). The chart refuses, with a message of its own, the few it sets
// itself.
func envSchema() ([]byte, error) {
	type variable struct {
		Description string   `json:"description"`
		Type        []string `json:"type"`
	}
	props := map[string]variable{}
	for _, v := range config.Variables() {
		d := v.Description
		if v.Default != "" {
			d += " (default " + v.Default + ")"
		}
		props[v.Name] = variable{d, []string{"string", "number", "boolean"}}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // ">= 0", not "\u003e= 0"
	enc.SetIndent("    ", "  ")
	err := enc.Encode(struct {
		Type                 string              `json:"type"`
		Description          string              `json:"description"`
		AdditionalProperties bool                `json:"additionalProperties"`
		Properties           map[string]variable `json:"properties"`
	}{
		Type: "object",
		Description: "INBOXKEEPER_* settings, name to value; anything else goes in extraEnv. " +
			"Generated from internal/platform/config: go test ./deploy -run TestChartSchemaKnowsEveryVariable -update-schema",
		Properties: props,
	})
	// One line for each variable's list of types.
	b := oneLineArray.ReplaceAllFunc(bytes.TrimSpace(buf.Bytes()), func(m []byte) []byte {
		s := strings.Join(strings.Fields(string(m)), " ")
		return []byte(strings.NewReplacer("[ ", "[", " ]", "]").Replace(s))
	})
	return b, err
}

var oneLineArray = regexp.MustCompile(`\[\s+("[a-z]+",\s+)*"[a-z]+"\s+\]`)

// schemaSection finds the value of properties.NAME in a JSON schema: its
// bytes, and where they start.
func schemaSection(schema []byte, name string) (raw json.RawMessage, start int, err error) {
	dec := json.NewDecoder(bytes.NewReader(schema))
	// want reads the next token and checks it.
	want := func(tok json.Token) error {
		got, err := dec.Token()
		if err == nil && got != tok {
			err = fmt.Errorf("%v where %v was expected", got, tok)
		}
		return err
	}
	// find reads an object's keys up to key, skipping the other values.
	find := func(key string) error {
		if err := want(json.Delim('{')); err != nil {
			return err
		}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			if k == key {
				return nil
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
		}
		return fmt.Errorf("no key %q", key)
	}
	if err := find("properties"); err != nil {
		return nil, 0, err
	}
	if err := find(name); err != nil {
		return nil, 0, err
	}
	if err := dec.Decode(&raw); err != nil {
		return nil, 0, err
	}
	return raw, int(dec.InputOffset()) - len(raw), nil
}

// The chart's values.schema.json knows every variable of the daemon and no
// other: its env section is what envSchema generates from internal/platform/config
// (run with -update-schema to rewrite it).
func TestChartSchemaKnowsEveryVariable(t *testing.T) {
	schema, err := os.ReadFile(chartSchema)
	if err != nil {
		t.Fatal(err)
	}
	raw, start, err := schemaSection(schema, "env")
	if err != nil {
		t.Fatalf("%s: properties.env: %v", chartSchema, err)
	}
	want, err := envSchema()
	if err != nil {
		t.Fatal(err)
	}
	var got, wanted any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(want, &wanted); err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(got, wanted) && bytes.Equal(raw, want) {
		return
	}
	if !*updateSchema {
		t.Fatalf("%s: the env section is not what internal/platform/config gives; regenerate it with\n"+
			"  go test ./deploy -run TestChartSchemaKnowsEveryVariable -update-schema\ngot:\n%s\nwant:\n%s", chartSchema, raw, want)
	}
	out := append(append(append([]byte{}, schema[:start]...), want...), schema[start+len(raw):]...)
	if !json.Valid(out) {
		t.Fatalf("%s: the rewritten schema is not JSON", chartSchema)
	}
	if err := os.WriteFile(chartSchema, out, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: env section rewritten from internal/platform/config", chartSchema)
}

// schemaSection finds what it is asked for, and says what it cannot find.
func TestSchemaSection(t *testing.T) {
	t.Parallel()
	doc := []byte(`{"a": 1, "properties": {"x": {"y": [1, 2]}, "env": {"k": "v"}, "z": 3}}`)
	raw, start, err := schemaSection(doc, "env")
	if err != nil || string(raw) != `{"k": "v"}` || string(doc[start:start+len(raw)]) != string(raw) {
		t.Errorf("schemaSection = %s at %d, %v", raw, start, err)
	}
	if _, _, err := schemaSection(doc, "w"); err == nil {
		t.Errorf("schemaSection found a key that is not there")
	}
	if _, _, err := schemaSection([]byte(`{"properties": `), "env"); err == nil {
		t.Errorf("schemaSection of a truncated document: %v", err)
	}
}

// Every values file of the chart's ci/ that carries a policy (ct lint and
// ct install render each on its own) carries one that parses.
func TestChartCIValuesPolicies(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("helm/inboxkeeper/ci/*-values.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in helm/inboxkeeper/ci: %v", err)
	}
	for _, f := range files {
		var vals struct {
			Policy struct {
				Inline            string `yaml:"inline"`
				ExistingConfigMap string `yaml:"existingConfigMap"`
			} `yaml:"policy"`
		}
		if err := yaml.Unmarshal([]byte(testfile.Read(t, f)), &vals); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		switch {
		case vals.Policy.Inline != "":
			if _, err := policy.Parse([]byte(vals.Policy.Inline), f+": policy.inline"); err != nil {
				t.Errorf("%s: policy.inline does not parse:\n%v", f, err)
			}
		case vals.Policy.ExistingConfigMap == "":
			t.Errorf("%s: no policy.inline and no policy.existingConfigMap: the chart refuses to render it on its own", f)
		}
	}
}
