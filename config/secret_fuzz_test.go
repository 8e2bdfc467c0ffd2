package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/homelab/bootstrap/internal/redact"
)

// secretShapes are values a user may paste where they do not belong, each
// with the part that must never be printed. byShape: recognised wherever
// it stands (so also in a log line of a config that validates); the others
// only in a message about a value meant as a name or a path.
var secretShapes = []struct {
	value, secret string
	byShape       bool
}{
	{"https://me:marker-u-0x5eed@git.lan/x", "marker-u-0x5eed", true},
	{"ntfy://:marker-n-0x5eed@ntfy.sh/topic", "marker-n-0x5eed", true},
	{"https://h.lan/x?pass=marker-p-0x5eed", "marker-p-0x5eed", true},
	{"https://h.lan/x#access_token=marker-a-0x5eed", "marker-a-0x5eed", true},
	{"robot:marker-r-0x5eed@ghcr.io/me/img", "marker-r-0x5eed", true},
	{"glpat-Mk0x5eedAbCdEfGhIj12", "glpat-Mk0x5eedAbCdEfGhIj12", true},
	{"ghp_0x5eedABCDEFGHIJKLMNOPQRSTUVWXYZ01234", "ghp_0x5eedABCDEFGHIJKLMNOPQRSTUVWXYZ01234", true},
	{"xoxb-0x5eed-1234567890-AbCdEfGhIjKlMnOp", "xoxb-0x5eed-1234567890-AbCdEfGhIjKlMnOp", true},
	{"AGE-SECRET-KEY-1QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQ", "QYQSZQGPQYQSZQGPQYQSZQGP", true},
	{"age-secret-key-pq-1qyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszq", "qyqszqgpqyqszqgpqyqszqgp", true},
	{"bootstrap@pve!lab=0b9d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4", "0b9d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4", true},
	{"0b9d1c2e-3f4a-4b5c-8d6e-7f80915eed00", "0b9d1c2e-3f4a-4b5c-8d6e-7f80915eed00", false},
	{"wJalrXUtnFEMI0K7MDENGbPxRfiCY0x5eedKEY", "wJalrXUtnFEMI0K7MDENGbPxRfiCY0x5eedKEY", false},
}

// schemaField is one place of the config a value can be typed: a leaf
// (string, number, bool, duration, list, map) or a whole section.
type schemaField struct {
	path    string
	section bool
}

// schemaFields lists every yaml field of t, from the Config types the
// JSON schema and docs/config.md are generated from: a new field is in
// the list without anyone adding it. A list of structs (nodes) is entered
// at its first element.
func schemaFields(t reflect.Type, prefix string) []schemaField {
	var out []schemaField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		path := strings.TrimPrefix(prefix+"."+name, ".")
		ft := f.Type
		switch {
		case ft.Kind() == reflect.Struct && ft != durationType:
			out = append(out, schemaField{path, true})
			out = append(out, schemaFields(ft, path)...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			out = append(out, schemaField{path, true})
			out = append(out, schemaFields(ft.Elem(), path+"[0]")...)
		default:
			out = append(out, schemaField{path, false})
		}
	}
	return out
}

// setPath sets the value at a dotted path of a YAML document, entering
// the first element of a list at a "[0]" step (made when missing).
func setPath(doc map[string]any, path string, value any) {
	steps := strings.Split(path, ".")
	m := doc
	for _, s := range steps[:len(steps)-1] {
		name, isList := strings.CutSuffix(s, "[0]")
		if isList {
			list, _ := m[name].([]any)
			if len(list) == 0 {
				list = []any{map[string]any{}}
				m[name] = list
			}
			next, ok := list[0].(map[string]any)
			if !ok {
				next = map[string]any{}
				list[0] = next
			}
			m = next
			continue
		}
		next, ok := m[name].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[name] = next
		}
		m = next
	}
	m[steps[len(steps)-1]] = value
}

// TestNoOutputQuotesASecretInAnyField types every secret shape into every
// field of the config (generated from the Config types) and as the key of
// every map: `config validate`'s output (the error, the warnings) never
// holds the secret, and a config that validates anyway prints it masked
// in what a run prints of it (config render, every log line through the
// run's redaction). Bounded: the whole sweep runs in make test.
func TestNoOutputQuotesASecretInAnyField(t *testing.T) {
	// No patches: a config that validates then generates no Talos
	// secrets bundle, which keeps the sweep to seconds.
	base := withValue(t, mustRead(t, "testdata/good/three-plus-two.yaml"), "cluster.patches", nil)
	dir := shapesDir(t)
	fields := schemaFields(reflect.TypeFor[Config](), "")
	if len(fields) < 100 {
		t.Fatalf("%d fields from the Config types: the walk lost some", len(fields))
	}
	start, budget := time.Now(), 4*time.Second
	runs := 0
	for fi, f := range fields {
		for si, s := range secretShapes {
			// Every field gets every shape when time allows; each gets
			// at least its share, rotating, so the sweep stays bounded
			// on a loaded machine.
			if time.Since(start) > budget && si != fi%len(secretShapes) {
				continue
			}
			var doc map[string]any
			if err := yaml.Unmarshal(base, &doc); err != nil {
				t.Fatal(err)
			}
			typ := fieldType(f.path)
			var v any = s.value
			switch {
			case f.section:
			case typ != nil && typ.Kind() == reflect.Slice:
				v = []any{s.value}
			case typ != nil && typ.Kind() == reflect.Map:
				v = map[string]any{s.value: s.value}
			}
			setPath(doc, f.path, v)
			data, err := yaml.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			runs++
			p := filepath.Join(dir, "bootstrap.yaml")
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := Load(p, noEnv)
			out := ""
			if err != nil {
				out = err.Error()
			} else {
				for _, w := range cfg.Warnings() {
					out += "\n" + w.Error()
				}
				if s.byShape {
					r, rerr := cfg.Render()
					if rerr != nil {
						t.Fatal(rerr)
					}
					set := &redact.Set{}
					for _, m := range cfg.MisplacedSecrets() {
						set.Add(m)
					}
					out += "\n" + string(r) + "\n" + set.String(`{"level":"info","value":"`+s.value+`"}`)
				}
			}
			if strings.Contains(out, s.secret) {
				t.Errorf("%s = %q: the output quotes %q:\n%s", f.path, s.value, s.secret, out)
			}
		}
	}
	t.Logf("%d fields, %d configs in %s", len(fields), runs, time.Since(start).Round(time.Millisecond))
}

// fieldType is the Go type of the field at a config path.
func fieldType(path string) reflect.Type {
	t := reflect.TypeFor[Config]()
	for _, step := range strings.Split(path, ".") {
		name, isList := strings.CutSuffix(step, "[0]")
		found := false
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if n, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); n == name {
				t, found = f.Type, true
				break
			}
		}
		if !found {
			return nil
		}
		if isList {
			t = t.Elem()
		}
	}
	return t
}
