package config

import (
	"fmt"
	"reflect"
	"strings"
)

// Reference renders the config reference as Markdown from the same types,
// doc tags and defaults as the schema (docs/config.md is generated from it).
func Reference() string {
	var b strings.Builder
	b.WriteString("# Config reference (`bootstrap.yaml`)\n\n")
	b.WriteString("Generated from the Go types (`go test ./config -run TestReferenceDoc -update`). ")
	b.WriteString("Relative paths are relative to the config file. Secrets are never read from this file.\n\n")
	b.WriteString("| key | type | default | description |\n|---|---|---|---|\n")
	var walk func(t reflect.Type, def reflect.Value, path string)
	walk = func(t reflect.Type, def reflect.Value, path string) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if !f.IsExported() || name == "" {
				continue
			}
			key := path + name
			var fv reflect.Value
			if def.IsValid() {
				fv = def.Field(i)
			}
			ft := f.Type
			if ft.Kind() == reflect.Struct && ft != durationType {
				walk(ft, fv, key+".")
				continue
			}
			typ := typeName(ft)
			if enum := f.Tag.Get("enum"); enum != "" {
				typ = strings.ReplaceAll(enum, ",", " \\| ")
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", key, typ, defaultText(fv), mdEscape(f.Tag.Get("doc")))
			if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
				walk(ft.Elem(), reflect.Value{}, key+"[].")
			}
		}
	}
	walk(reflect.TypeFor[Config](), reflect.ValueOf(*Default()), "")
	return b.String()
}

func typeName(t reflect.Type) string {
	switch {
	case t == durationType:
		return "duration"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		return "list of objects"
	case t.Kind() == reflect.Slice:
		return "list of " + typeName(t.Elem())
	case t.Kind() == reflect.Map:
		return "map of " + typeName(t.Elem())
	case t.Kind() == reflect.Int:
		return "integer"
	case t.Kind() == reflect.Bool:
		return "boolean"
	}
	return "string"
}

func defaultText(v reflect.Value) string {
	if !v.IsValid() || v.IsZero() {
		return ""
	}
	switch {
	case v.Type() == durationType:
		return "`" + Duration(v.Int()).D().String() + "`"
	case v.Kind() == reflect.Slice:
		if v.Len() == 0 {
			return ""
		}
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = fmt.Sprint(v.Index(i).Interface())
		}
		return "`[" + strings.Join(parts, ", ") + "]`"
	case v.Kind() == reflect.Map:
		return ""
	}
	return "`" + fmt.Sprint(v.Interface()) + "`"
}

// mdEscape keeps <placeholders> and pipes from breaking the Markdown table.
func mdEscape(s string) string {
	return strings.NewReplacer("<", "&lt;", ">", "&gt;", "|", "\\|").Replace(s)
}
