package config

import (
	"encoding"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// pos is a position in a config file: the loaded one, or (file set) a base
// it extends.
type pos struct {
	line, col int
	file      string
}

// decoder overlays a YAML document onto a Go value strictly: unknown keys,
// duplicate keys and wrongly typed values are errors with file:line and the
// field path. Keys absent from the file keep the value already there (the
// defaults).
type decoder struct {
	file      string
	positions map[string]pos
	errs      []*FieldError
	// origin names the base file a node came from (extends.go).
	origin map[*yaml.Node]string
}

// at is where n sits: its line and column in the file it came from.
func (d *decoder) at(n *yaml.Node) pos {
	p := pos{line: n.Line, col: n.Column}
	if f := d.origin[n]; f != "" && f != d.file {
		p.file = f
	}
	return p
}

func (d *decoder) fail(n *yaml.Node, path, format string, a ...any) {
	fe := &FieldError{File: d.file, Path: path, Msg: message(format, a...)}
	if n != nil {
		p := d.at(n)
		fe.Line, fe.Col = p.line, p.col
		if p.file != "" {
			fe.File = p.file
		}
	}
	d.errs = append(d.errs, fe)
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	for n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if path != "" {
		if _, seen := d.positions[path]; !seen {
			d.positions[path] = d.at(n)
		}
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // "key:" with no value keeps the default
	}
	if v.CanAddr() && v.Addr().Type().Implements(textUnmarshaler) {
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected a single value, got %s", kindName(n))
			return
		}
		if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
			d.fail(n, path, "%v", err)
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "expected a list, got %s", kindName(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "expected a mapping, got %s", kindName(n))
			return
		}
		m := reflect.MakeMap(v.Type())
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			sub := path + "." + k.Value
			if m.MapIndex(reflect.ValueOf(k.Value)).IsValid() {
				d.fail(k, sub, "duplicate key %q", k.Value)
				continue
			}
			d.positions[sub] = d.at(k)
			e := reflect.New(v.Type().Elem()).Elem()
			d.decode(val, e, sub)
			m.SetMapIndex(reflect.ValueOf(k.Value), e)
		}
		v.Set(m)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected a single value, got %s", kindName(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Int:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected a whole number, got %s", kindName(n))
			return
		}
		i, err := strconv.ParseInt(n.Value, 10, 64)
		if err != nil || n.Tag == "!!str" {
			d.fail(n, path, "expected a whole number, got %q", n.Value)
			return
		}
		v.SetInt(i)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected true or false, got %s", kindName(n))
			return
		}
		switch strings.ToLower(n.Value) {
		case "true", "yes", "on":
			v.SetBool(true)
		case "false", "no", "off":
			v.SetBool(false)
		default:
			d.fail(n, path, "expected true or false, got %q", n.Value)
		}
	default:
		d.fail(n, path, "unsupported field type %s", v.Type())
	}
}

// secretKeys are keys someone might try to put a secret under; they get a
// pointed message instead of a plain "unknown field".
var secretKeys = map[string]bool{"tokensecret": true, "secret": true, "password": true, "token": true, "apitoken": true}

// notifyURLKeys are where someone might write notification URLs inline.
var notifyURLKeys = map[string]bool{"urls": true, "url": true, "services": true, "targets": true}

// s3SecretKeys are the names an S3 key pair goes by in other tools.
var s3SecretKeys = map[string]bool{"accesskey": true, "secretkey": true, "accesskeyid": true, "secretaccesskey": true,
	"aws_access_key_id": true, "aws_secret_access_key": true}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "expected a mapping, got %s", kindName(n))
		return
	}
	fields := yamlFields(v.Type())
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		sub := joinPath(path, k.Value)
		if seen[k.Value] {
			d.fail(k, sub, "duplicate key %q", k.Value)
			continue
		}
		seen[k.Value] = true
		idx, ok := fields[k.Value]
		if !ok {
			d.unknown(k, path, sub, fields)
			continue
		}
		d.positions[sub] = d.at(k)
		d.decode(val, v.Field(idx), sub)
	}
}

func (d *decoder) unknown(k *yaml.Node, path, sub string, fields map[string]int) {
	if path == "backup.s3" && (s3SecretKeys[strings.ToLower(k.Value)] || secretKeys[strings.ToLower(k.Value)]) {
		d.fail(k, sub, "S3 keys are never read from the config file: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or point backup.s3.credentialsFile at a 0600 AWS shared credentials file")
		return
	}
	if path == "postcheck.notify" && notifyURLKeys[strings.ToLower(k.Value)] {
		d.fail(k, sub, "notification URLs carry their services' credentials and are never read from the config file: put them, one per line, in a 0600 file named by postcheck.notify.urlsFile, or in the environment variable postcheck.notify.urlsEnv names")
		return
	}
	if secretKeys[strings.ToLower(k.Value)] {
		d.fail(k, sub, "secrets are never read from the config file: set PROXMOX_TOKEN_SECRET or point proxmox.tokenSecretFile at a 0600 file")
		return
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	hint := ""
	if s := closest(k.Value, names); s != "" {
		hint = fmt.Sprintf(" (did you mean %q?)", s)
	} else {
		hint = fmt.Sprintf(" (known: %s)", strings.Join(sortedCopy(names), ", "))
	}
	where := path
	if where == "" {
		where = "the top level"
	}
	d.fail(k, sub, "unknown field %q in %s%s", k.Value, where, hint)
}

// yamlFields maps yaml keys to field indexes of struct type t.
func yamlFields(t reflect.Type) map[string]int {
	out := map[string]int{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if name == "" || name == "-" {
			continue
		}
		out[name] = i
	}
	return out
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// closest returns the candidate nearest to s by edit distance (case
// insensitive) when it is near enough to be a typo, else "".
func closest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	ls := strings.ToLower(s)
	for _, c := range sortedCopy(candidates) {
		lc := strings.ToLower(c)
		if lc == ls {
			return c
		}
		if dd := levenshtein(ls, lc); dd < bestD {
			best, bestD = c, dd
		}
	}
	limit := 2
	if len(s) > 8 {
		limit = 3
	}
	if bestD <= limit {
		return best
	}
	return ""
}

func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
