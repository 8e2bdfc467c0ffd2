package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/homelab/bootstrap/internal/redact"
)

// A config may extend a base (`extends: ../base.yaml`): the base is read
// first, the file's own values are merged over it (mappings deeply, a list
// replaced as a whole), and the merged document is what is decoded and
// validated. Relative file paths keep meaning what they meant in the file
// that names them: a base's are rewritten relative to the extending file.
// Every value remembers the file it came from, so an error names it.

// extendsKey is the top-level key naming the base file.
const extendsKey = "extends"

// maxExtends bounds a chain of bases (a loop is reported before this).
const maxExtends = 8

// layered is a config document merged from its chain of files.
type layered struct {
	root *yaml.Node
	// origin maps each node to the file it came from (unmapped: the
	// file that was loaded).
	origin map[*yaml.Node]string
	// files are the chain, the loaded file first, its base after it.
	files []string
}

// layer parses data (from path) and, when it extends a base, merges it over
// the base. Problems are FieldErrors in the file they are in.
func layer(path string, data []byte, seen []string) (*layered, []*FieldError) {
	l := &layered{origin: map[*yaml.Node]string{}, files: []string{path}}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		fe := &FieldError{File: path, Msg: redact.Text(strings.TrimPrefix(err.Error(), "yaml: "))}
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			fmt.Sscan(m[1], &fe.Line)
			fe.Msg = strings.TrimSpace(strings.TrimPrefix(fe.Msg, m[0][len("yaml: "):]))
		}
		return nil, []*FieldError{fe}
	}
	l.root = &root
	doc := document(&root)
	if doc == nil || doc.Kind != yaml.MappingNode {
		return l, nil
	}
	i := mappingIndex(doc, extendsKey)
	if i < 0 {
		return l, nil
	}
	ref := doc.Content[i+1]
	doc.Content = slices.Delete(doc.Content, i, i+2)
	fail := func(format string, a ...any) (*layered, []*FieldError) {
		return nil, []*FieldError{{File: path, Line: ref.Line, Col: ref.Column, Path: extendsKey, Msg: fmt.Sprintf(format, a...)}}
	}
	if ref.Kind != yaml.ScalarNode || ref.Value == "" {
		return fail("expected the path of a base config file, got %s", kindName(ref))
	}
	basePath := ref.Value
	if !filepath.IsAbs(basePath) {
		basePath = filepath.Join(filepath.Dir(path), basePath)
	}
	abs, _ := filepath.Abs(basePath)
	if slices.Contains(seen, abs) {
		return fail("%s extends itself through %s: a chain of bases must end", ref.Value, strings.Join(append(seen, abs), " → "))
	}
	if len(seen) >= maxExtends {
		return fail("more than %d bases in a chain", maxExtends)
	}
	baseData, err := os.ReadFile(basePath)
	if err != nil {
		return fail("reading the base %s: %v", ref.Value, err)
	}
	base, errs := layer(basePath, baseData, append(seen, abs))
	if len(errs) > 0 {
		return nil, errs
	}
	bdoc := document(base.root)
	if bdoc == nil || bdoc.Kind != yaml.MappingNode {
		return fail("the base %s holds no mapping", ref.Value)
	}
	mark(bdoc, basePath, base.origin)
	rebasePaths(bdoc, reflect.TypeFor[Config](), filepath.Dir(basePath), filepath.Dir(path))
	merge(bdoc, doc)
	l.root, l.origin, l.files = base.root, base.origin, append([]string{path}, base.files...)
	return l, nil
}

// document is the top node of a parsed YAML document (nil when empty).
func document(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		n = n.Content[0]
	}
	return n
}

// mappingIndex is the index of key's key node in the mapping m, or -1.
func mappingIndex(m *yaml.Node, key string) int {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return i
		}
	}
	return -1
}

// mark records file as the origin of n and everything under it, unless an
// earlier base already claimed a node.
func mark(n *yaml.Node, file string, origin map[*yaml.Node]string) {
	if _, ok := origin[n]; !ok {
		origin[n] = file
	}
	for _, c := range n.Content {
		mark(c, file, origin)
	}
}

// merge lays over onto base: a key both map to mappings is merged
// further, any other value of over replaces base's (a list as a whole).
func merge(base, over *yaml.Node) {
	seen := map[string]bool{}
	for i := 0; i+1 < len(over.Content); i += 2 {
		k, v := over.Content[i], over.Content[i+1]
		j := mappingIndex(base, k.Value)
		switch {
		case seen[k.Value]:
			// A key the file repeats stays repeated: the decoder
			// reports it, as it does without a base.
			base.Content = append(base.Content, k, v)
		case j < 0:
			base.Content = append(base.Content, k, v)
		case base.Content[j+1].Kind == yaml.MappingNode && v.Kind == yaml.MappingNode:
			merge(base.Content[j+1], v)
		default:
			base.Content[j], base.Content[j+1] = k, v
		}
		seen[k.Value] = true
	}
}

// rebasePaths rewrites the relative file paths under n (the fields tagged
// path:"file" of t) from dir from to dir to, so that they name the same
// files once the document they are in is merged into one in another
// directory.
func rebasePaths(n *yaml.Node, t reflect.Type, from, to string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind != yaml.MappingNode || t.Kind() != reflect.Struct {
		return
	}
	fields := yamlFields(t)
	for i := 0; i+1 < len(n.Content); i += 2 {
		idx, ok := fields[n.Content[i].Value]
		if !ok {
			continue
		}
		f := t.Field(idx)
		v := n.Content[i+1]
		if f.Tag.Get("path") == "file" {
			rebaseScalars(v, from, to)
			continue
		}
		switch ft := f.Type; ft.Kind() {
		case reflect.Struct, reflect.Pointer:
			rebasePaths(v, ft, from, to)
		case reflect.Slice:
			if v.Kind == yaml.SequenceNode {
				for _, e := range v.Content {
					rebasePaths(e, ft.Elem(), from, to)
				}
			}
		}
	}
}

// rebaseScalars rewrites every relative path scalar under n.
func rebaseScalars(n *yaml.Node, from, to string) {
	if n.Kind == yaml.ScalarNode {
		p := n.Value
		if p == "" || n.Tag == "!!null" || filepath.IsAbs(p) || p == "~" || strings.HasPrefix(p, "~/") {
			return
		}
		if rel, err := filepath.Rel(to, filepath.Join(from, p)); err == nil {
			n.Value = rel
		}
		return
	}
	// A mapping's keys (patches per node name) are not paths.
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 0 {
			continue
		}
		rebaseScalars(c, from, to)
	}
}

// Render is the merged config as YAML: what the tool reads after applying
// every base, with the chain it came from in a header comment.
func (c *Config) Render() ([]byte, error) {
	if c.src == nil || c.src.merged == nil {
		return nil, fmt.Errorf("the config was not loaded from a file")
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s, merged from: %s\n", c.src.file, strings.Join(c.src.files, " ← "))
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(c.src.merged); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	// Printed: a secret typed anywhere in the chain is masked like in
	// every other output.
	return []byte(redact.Text(b.String())), nil
}

// Files are the config files this config was read from: the file itself,
// then each base it extends.
func (c *Config) Files() []string {
	if c.src == nil {
		return nil
	}
	return slices.Clone(c.src.files)
}
