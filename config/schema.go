package config

import (
	"encoding/json"
	"reflect"
	"strings"
)

// Schema returns a JSON Schema (draft 2020-12) for bootstrap.yaml, generated
// from the Config types and their doc tags, with the defaults filled in.
func Schema() ([]byte, error) {
	s := schemaFor(reflect.TypeFor[Config](), reflect.ValueOf(*Default()))
	// extends is read before decoding (extends.go), so no field holds it.
	s["properties"].(map[string]any)[extendsKey] = map[string]any{"type": "string",
		"description": "Optional base config file this one extends (relative to this file): mappings merge deeply, lists and values here replace the base's."}
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	s["title"] = "bootstrap.yaml"
	s["description"] = "Configuration of one cluster for the bootstrap runner."
	return json.MarshalIndent(s, "", "  ")
}

var durationType = reflect.TypeFor[Duration]()

func schemaFor(t reflect.Type, def reflect.Value) map[string]any {
	if t == durationType {
		out := map[string]any{"type": "string", "pattern": `^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`}
		if def.IsValid() {
			out["default"] = Duration(def.Int()).D().String()
		}
		return out
	}
	switch t.Kind() {
	case reflect.Struct:
		props := map[string]any{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if !f.IsExported() || name == "" || name == "-" {
				continue
			}
			var fv reflect.Value
			if def.IsValid() {
				fv = def.Field(i)
			}
			p := schemaFor(f.Type, fv)
			if enum := f.Tag.Get("enum"); enum != "" {
				p["enum"] = strings.Split(enum, ",")
			}
			if doc := f.Tag.Get("doc"); doc != "" {
				p["description"] = doc
			}
			props[name] = p
		}
		return map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	case reflect.Slice:
		out := map[string]any{"type": "array", "items": schemaFor(t.Elem(), reflect.Value{})}
		if def.IsValid() && def.Len() > 0 {
			out["default"] = def.Interface()
		}
		return out
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaFor(t.Elem(), reflect.Value{})}
	case reflect.String:
		out := map[string]any{"type": "string"}
		if def.IsValid() && def.String() != "" {
			out["default"] = def.String()
		}
		return out
	case reflect.Int:
		out := map[string]any{"type": "integer"}
		if def.IsValid() && def.Int() != 0 {
			out["default"] = def.Int()
		}
		return out
	case reflect.Bool:
		out := map[string]any{"type": "boolean"}
		if def.IsValid() && def.Bool() {
			out["default"] = true
		}
		return out
	}
	return map[string]any{}
}
